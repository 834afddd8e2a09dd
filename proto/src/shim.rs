//! The daemon ⇄ shim protocol: one JSON request per line on the shim's unix socket, answered by one
//! JSON response line. Each request opens its own connection, so a long `ExecSync` never blocks others.
//!
//! The shim owns a pod's processes; the daemon owns the records. Data flows one way: the daemon asks,
//! the shim acts and reports what the kernel says.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Namespace sharing for the pod's infra process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InfraSpec {
    pub hostname: String,
    /// New network namespace (false for host-network pods).
    pub net: bool,
    pub ipc: bool,
    pub uts: bool,
    /// New pid namespace with the infra process as PID 1 (false for host-PID pods).
    pub pid: bool,
    /// A network namespace the daemon made and pinned (with `net` false): the infra process
    /// joins it, so that the CNI ADD runs while the shim starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
    /// A new user namespace holding the other new ones, with these `uid_map` and `gid_map`
    /// texts (a pod with `hostUsers: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub userns: Option<InfraUserns>,
    /// The SELinux label the infra process runs under, where the node has SELinux.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selinux_label: Option<String>,
    /// The pod's uid (its metadata's), where it can name a directory: the kubelet keeps the
    /// pod's volumes under `/var/lib/kubelet/pods/<uid>`, which a create's view keeps while it
    /// drops the other pods'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The daemon's empty mount namespace (a read-only tmpfs root, nothing else), which the infra
    /// process joins instead of copying the node's mounts and detaching them all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_mnt: Option<PathBuf>,
}

/// A shim's ready report, which `crishim-shim start` prints once the shim's socket takes
/// requests (a shim that cannot start reports `error: <why>` instead, and its start fails).
pub fn ready_line(infra_pid: i32) -> String {
    format!("ok {infra_pid}\n")
}

/// The infra pid from a pod shim's ready report; otherwise why the shim did not start.
pub fn parse_ready(out: &[u8]) -> Result<i32, String> {
    let text = String::from_utf8_lossy(out);
    let text = text.trim();
    if let Some(why) = text.strip_prefix("error:") {
        return Err(why.trim().to_string());
    }
    let shown = || crishim_sys::shown::shown_bytes(text.as_bytes());
    match text.strip_prefix("ok").map(|p| p.trim().parse::<i32>()) {
        Some(Ok(pid)) if pid > 0 => Ok(pid),
        Some(_) => Err(format!("shim did not report an infra process: {}", shown())),
        None if text.is_empty() => Err("shim exited before it was ready".into()),
        None => Err(format!("unexpected ready report {}", shown())),
    }
}

/// Whether `uid` can name a directory of its own: 1 to 64 ASCII letters, digits and `-` (a
/// Kubernetes uid is a UUID).
pub fn is_dir_safe_uid(uid: &str) -> bool {
    (1..=64).contains(&uid.len()) && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InfraUserns {
    pub uid_map: String,
    pub gid_map: String,
}

/// An external OCI runtime (runc, crun, runsc, youki) that a pod's shim drives through its CLI,
/// for a `[runtimes.<name>]` handler; without one the shim runs containers with libcontainer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OciRuntimeSpec {
    /// The runtime's binary, an absolute path.
    pub binary: PathBuf,
    /// Its `--root` (state directory): `<state_dir>/runtimes/<name>`.
    pub root: PathBuf,
    /// Pass `--systemd-cgroup`: the node's cgroup driver is systemd.
    pub systemd_cgroup: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Liveness and the infra pid.
    Ping,
    /// Create a container from an OCI bundle whose rootfs is already mounted. It does not run yet.
    Create {
        id: String,
        bundle: PathBuf,
        /// CRI log file; empty for none.
        log_path: PathBuf,
        /// The directory (the pod's `log_directory`) below which no symlink in `log_path` is
        /// followed: a container that can write it must not steer the shim's writes. Empty:
        /// `log_path`'s own directory.
        #[serde(default)]
        log_root: PathBuf,
        /// Keep a pipe for stdin (CRI `stdin`).
        stdin: bool,
        tty: bool,
        /// A missing or non-executable command fails the start instead (exit 128, `StartError`),
        /// as the CRI's containerd does; runc, and `crishim bundle`, refuse it at create.
        #[serde(default)]
        start_error_at_start: bool,
    },
    Start {
        id: String,
    },
    /// Signal the container's init (or every process in it, with `all`).
    Kill {
        id: String,
        signal: i32,
        all: bool,
    },
    /// Remove the container's runtime state and cgroup; kills it first if it still runs.
    Delete {
        id: String,
    },
    State {
        id: String,
    },
    /// Run a process in a running container and collect its output.
    Exec {
        id: String,
        args: Vec<String>,
        /// Seconds; 0 = no timeout.
        timeout: u64,
    },
    /// Run a process in a running container with its stdio on this connection: after an `Ok`
    /// line, both sides speak [`frames`]. The process is killed if the connection drops.
    ExecStream {
        id: String,
        args: Vec<String>,
        tty: bool,
        stdin: bool,
    },
    /// Connect to a running container's stdio: after an `Ok` line, output frames go out and
    /// stdin frames come in. `close_stdin` closes the container's stdin when the caller's ends
    /// (CRI `stdin_once`).
    Attach {
        id: String,
        stdin: bool,
        close_stdin: bool,
    },
    ReopenLog {
        id: String,
    },
    /// Change a running container's cgroup limits.
    Update {
        id: String,
        resources: Box<oci_spec::runtime::LinuxResources>,
    },
    /// Keep the connection open: the shim answers with one `State` line for every container that
    /// has already exited, then `Ok` (caught up), then one `State` line per exit as it happens.
    /// The connection ending means the shim is gone.
    Watch,
    /// Kill every container and the infra process, then exit. (The foreground shim of
    /// `crishim bundle run` exits once its container is deleted, restoring its caller's terminal.)
    Shutdown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Created,
    Running,
    Exited,
    Unknown,
}

/// What the shim knows about one container; also its on-disk record, so an exit is not lost while
/// the daemon is down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerState {
    pub id: String,
    pub status: Status,
    pub pid: i32,
    /// Unix nanoseconds; 0 when not yet.
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    /// Killed by the kernel's OOM killer.
    pub oom_killed: bool,
    /// Why the state is what it is, when it is not plain (e.g. the shim lost track of it).
    pub message: String,
    /// The CRI reason where the exit code alone does not say it (`StartError`); empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl ContainerState {
    /// A state with nothing finished yet: no start, exit, OOM kill, message or reason.
    pub fn new(id: impl Into<String>, status: Status, pid: i32, created_at: i64) -> Self {
        ContainerState {
            id: id.into(),
            status,
            pid,
            created_at,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            oom_killed: false,
            message: String::new(),
            reason: String::new(),
        }
    }
}

/// The reason of a container whose process could not be started (containerd's name for it).
pub const START_ERROR: &str = "StartError";
/// Its exit code, as containerd reports it.
pub const START_ERROR_EXIT_CODE: i32 = 128;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    Ok,
    Pong {
        infra_pid: i32,
        shim_pid: i32,
    },
    State(ContainerState),
    /// Output travels as base64 (4/3 of its size, where a JSON array of numbers took about 4×).
    Exec {
        exit_code: i32,
        #[serde(with = "base64_bytes")]
        stdout: Vec<u8>,
        #[serde(with = "base64_bytes")]
        stderr: Vec<u8>,
        timed_out: bool,
    },
    Error {
        kind: ErrorKind,
        message: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    /// A transient failure of something the shim depends on (systemd over D-Bus): try again.
    Unavailable,
    Internal,
}

impl Response {
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Self {
        Response::Error {
            kind,
            message: message.into(),
        }
    }
}

/// `ExecSync` output kept, stdout and stderr together: the CRI reply must fit the 16 MiB gRPC
/// message limit, and the rest of it (the exit code, field tags) takes a few bytes.
pub const MAX_EXEC_OUTPUT: usize = (16 << 20) - (64 << 10);

/// The longest line either side sends on a shim connection: an `Exec` answer with all of
/// [`MAX_EXEC_OUTPUT`] in base64, and room for the rest. Longer lines are refused, not buffered.
pub const MAX_LINE: usize = MAX_EXEC_OUTPUT.div_ceil(3) * 4 + (64 << 10);

/// Cut `stdout` and `stderr` to [`MAX_EXEC_OUTPUT`] together, keeping the start of each, as
/// containerd truncates. Each stream keeps at least half of the budget when it has that much, so
/// a flood on one still leaves the other readable; a shorter one is kept whole.
pub fn truncate_exec_output(stdout: &mut Vec<u8>, stderr: &mut Vec<u8>) {
    let keep_err = stderr
        .len()
        .min((MAX_EXEC_OUTPUT / 2).max(MAX_EXEC_OUTPUT.saturating_sub(stdout.len())));
    stderr.truncate(keep_err);
    stdout.truncate(MAX_EXEC_OUTPUT - keep_err);
}

/// `Vec<u8>` as a base64 string.
mod base64_bytes {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

/// Files the shim keeps in its pod state directory.
/// The framing of [`Request::ExecStream`] and [`Request::Attach`] connections: a kind byte, a
/// big-endian u32 length, the payload.
pub mod frames {
    pub const STDIN: u8 = 0;
    pub const STDOUT: u8 = 1;
    pub const STDERR: u8 = 2;
    /// The process exited: an i32 exit code, big-endian.
    pub const EXIT: u8 = 3;
    /// A terminal size: u16 width, u16 height, big-endian.
    pub const RESIZE: u8 = 4;
    /// The caller's stdin ended.
    pub const STDIN_EOF: u8 = 5;
    /// The caller detached (a TTY session's detach sequence): stop relaying, and let the process
    /// run on instead of killing it when the connection closes.
    pub const DETACH: u8 = 6;
    pub const HEADER: usize = 5;
    /// Frames are split to at most this much payload.
    pub const MAX_PAYLOAD: usize = 64 * 1024;

    pub fn encode(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::with_capacity(HEADER + payload.len());
        f.push(kind);
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// (kind, payload length) of a header.
    pub fn decode_header(h: [u8; HEADER]) -> (u8, usize) {
        (h[0], u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize)
    }
}

/// SIGKILL the process a pid file recorded if it is still that process. Pids get reused: a
/// file with a start time matches only the process that started then (any other, a pod's infra
/// process included, is left alone); an older file, with the pid alone, matches by the command
/// name (`crishim-shim`, `crishim-pause`). The check and the kill go through one pidfd, so the
/// pid cannot change hands between them.
pub fn kill_if_ours(recorded: &pid_file::Recorded) {
    let pid = recorded.pid;
    if pid <= 0 {
        return;
    }
    // Taken before the check, so that the process checked is the one signalled.
    // SAFETY: pidfd_open with a positive pid and no flags; the descriptor is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let pidfd = (fd >= 0).then(|| {
        use std::os::fd::FromRawFd as _;
        // SAFETY: a fresh descriptor nothing else owns.
        unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) }
    });
    if !recorded.is_running() {
        return;
    }
    match pidfd {
        Some(fd) => {
            use std::os::fd::AsRawFd as _;
            // SAFETY: a pidfd, a signal number, no siginfo, no flags.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
        }
        // SAFETY: kill(2) on a positive pid (a kernel before pidfds: 5.3).
        None => unsafe {
            libc::kill(pid, libc::SIGKILL);
        },
    }
}

/// Pid files (`shim.pid`, `infra.pid`): `<pid> <start time>`, the start time being field 22 of
/// `/proc/<pid>/stat` (clock ticks since boot), so that a process that took the pid since is
/// told apart from the one recorded. Files written by older shims hold the pid alone.
pub mod pid_file {
    use std::path::Path;

    /// What a pid file says.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Recorded {
        pub pid: i32,
        /// `None` in files of older shims.
        pub start: Option<u64>,
    }

    impl Recorded {
        /// Whether the recorded process still runs under its pid (a zombie does not), judged by
        /// its start time, or by its command name where none was recorded.
        pub fn is_running(&self) -> bool {
            let Some((state, start)) = stat(self.pid) else {
                return false;
            };
            if state == 'Z' {
                return false;
            }
            match self.start {
                Some(s) => s == start,
                None => {
                    let cmdline =
                        std::fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
                    let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
                    let name = argv0.rsplit(|b| *b == b'/').next().unwrap_or_default();
                    name == b"crishim-shim" || name == b"crishim-pause"
                }
            }
        }
    }

    /// When `pid` started, in clock ticks since boot (`/proc/<pid>/stat` field 22): with the pid,
    /// what names one process over time.
    pub fn start_time(pid: i32) -> Option<u64> {
        stat(pid).map(|(_, start)| start)
    }

    /// The text of a pid file for the running process `pid`.
    pub fn text(pid: i32) -> String {
        match stat(pid) {
            Some((_, start)) => format!("{pid} {start}\n"),
            None => format!("{pid}\n"),
        }
    }

    /// A pid file's content; `None` for anything but a positive pid (0 and -1 would mean "any
    /// child" to `waitpid` and "every process" to `kill`) and an optional start time.
    pub fn parse(text: &str) -> Option<Recorded> {
        let mut fields = text.split_ascii_whitespace();
        let pid = fields.next()?.parse::<i32>().ok().filter(|p| *p > 0)?;
        let start = match fields.next() {
            Some(s) => Some(s.parse::<u64>().ok()?),
            None => None,
        };
        if fields.next().is_some() {
            return None;
        }
        Some(Recorded { pid, start })
    }

    /// The pid file at `path`, if there is a valid one (a pid file is a line: 64 bytes read).
    pub fn read(path: &Path) -> Option<Recorded> {
        use std::io::Read as _;
        let mut text = String::new();
        std::fs::File::open(path)
            .ok()?
            .take(64)
            .read_to_string(&mut text)
            .ok()?;
        parse(&text)
    }

    /// The state letter and start time of `pid`, from `/proc/<pid>/stat` (the command name,
    /// which may hold spaces and parentheses, ends at the last `)`).
    fn stat(pid: i32) -> Option<(char, u64)> {
        if pid <= 0 {
            return None;
        }
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = text.get(text.rfind(')')? + 1..)?;
        let mut fields = rest.split_ascii_whitespace();
        let state = fields.next()?.chars().next()?;
        // Fields 3 onwards; the start time is field 22.
        let start = fields.nth(22 - 4)?.parse().ok()?;
        Some((state, start))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_pid_file_names_its_process_and_no_later_one() {
            assert_eq!(parse("0"), None);
            assert_eq!(parse("-1 5"), None);
            assert_eq!(parse("12 x"), None);
            assert_eq!(parse("12 5 6"), None);
            assert_eq!(
                parse(" 12\n"),
                Some(Recorded {
                    pid: 12,
                    start: None
                })
            );
            let me = std::process::id() as i32;
            let rec = parse(&text(me)).unwrap();
            assert_eq!(rec.pid, me);
            assert!(rec.start.is_some());
            assert!(rec.is_running(), "this process, as recorded");
            let later = Recorded {
                start: rec.start.map(|s| s + 1),
                ..rec
            };
            assert!(!later.is_running(), "another process under the same pid");
            // An old file: by the name, and this test binary is not crishim's.
            assert!(!Recorded {
                pid: me,
                start: None
            }
            .is_running());
        }

        /// A process that took a recorded pid is not killed: here one whose start time differs.
        #[test]
        fn kill_if_ours_spares_a_process_that_is_not_the_recorded_one() {
            let mut child = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap();
            let pid = child.id() as i32;
            let rec = parse(&text(pid)).unwrap();
            super::super::kill_if_ours(&Recorded {
                start: rec.start.map(|s| s.wrapping_sub(1)),
                ..rec
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(
                child.try_wait().unwrap().is_none(),
                "a later process was killed"
            );
            super::super::kill_if_ours(&rec);
            let status = child.wait().unwrap();
            use std::os::unix::process::ExitStatusExt as _;
            assert_eq!(status.signal(), Some(libc::SIGKILL));
        }
    }
}

pub mod paths {
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::path::{Path, PathBuf};

    /// A unix socket path may be at most 107 bytes, and a pod's state directory can be longer. So
    /// sockets are named through a descriptor of their directory: `/proc/self/fd/<n>/<name>` is
    /// short whatever the directory is. Keep the returned descriptor alive while using the path.
    pub fn short_socket_path(dir: &Path, name: &str) -> std::io::Result<(OwnedFd, PathBuf)> {
        let fd: OwnedFd = std::fs::File::open(dir)?.into();
        let path = PathBuf::from(format!("/proc/self/fd/{}/{name}", fd.as_raw_fd()));
        Ok((fd, path))
    }

    /// Under the state directory: each pod's hostname, hosts and resolv.conf, on a tmpfs of
    /// their own (`pod-files/<pod>`), which a create's view keeps.
    pub const POD_FILES: &str = "pod-files";
    pub const SOCKET: &str = "shim.sock";
    pub const SHIM_PID: &str = "shim.pid";
    pub const INFRA_PID: &str = "infra.pid";
    /// The pod's [`super::OciRuntimeSpec`], when it has an external runtime (read by `cleanup`).
    pub const OCI_RUNTIME: &str = "oci-runtime.json";
    /// Per container: `<id>.state.json`.
    pub fn state_file(id: &str) -> String {
        format!("{id}.state.json")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shims_ready_report_gives_the_infra_pid_or_why_it_did_not_start() {
        assert_eq!(parse_ready(b"ok 4242\n"), Ok(4242));
        assert_eq!(parse_ready(ready_line(7).as_bytes()), Ok(7));
        assert_eq!(
            parse_ready(b"error: spawning the infra process: ENOENT"),
            Err("spawning the infra process: ENOENT".into())
        );
        let refused = |out: &[u8]| parse_ready(out).unwrap_err();
        assert!(refused(b"").contains("exited before it was ready"));
        for bad in [&b"ok 0\n"[..], b"ok -3\n", b"ok 99999999999\n", b"ok\n"] {
            assert!(
                refused(bad).contains("infra"),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(refused(b"\xff\xfe garbage").contains("unexpected ready report"));
        // A long report (4 times the daemon's cap on what it keeps) is shown cut, not whole.
        assert!(refused(&vec![b'x'; 16 << 10]).len() < 512);
    }

    #[test]
    fn exec_output_travels_as_base64_within_the_line_cap() {
        let mut stdout = vec![0xffu8; MAX_EXEC_OUTPUT];
        let mut stderr = Vec::new();
        truncate_exec_output(&mut stdout, &mut stderr);
        let line = serde_json::to_vec(&Response::Exec {
            exit_code: 0,
            stdout: stdout.clone(),
            stderr,
            timed_out: false,
        })
        .unwrap();
        assert!(line.len() < MAX_LINE, "{} bytes", line.len());
        // Four thirds of the output, not a JSON array of numbers (about 4×).
        assert!(line.len() < MAX_EXEC_OUTPUT / 3 * 4 + 200);
        match serde_json::from_slice(&line).unwrap() {
            Response::Exec { stdout: back, .. } => assert!(back == stdout),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exec_output_is_truncated_to_fit_one_grpc_message() {
        let cases = [
            // (stdout, stderr) lengths before, after.
            ((10, 20), (10, 20)),
            ((MAX_EXEC_OUTPUT + 5, 0), (MAX_EXEC_OUTPUT, 0)),
            ((MAX_EXEC_OUTPUT, 100), (MAX_EXEC_OUTPUT - 100, 100)),
            ((100, 20 << 20), (100, MAX_EXEC_OUTPUT - 100)),
            (
                (20 << 20, 20 << 20),
                (MAX_EXEC_OUTPUT - MAX_EXEC_OUTPUT / 2, MAX_EXEC_OUTPUT / 2),
            ),
        ];
        for ((o, e), want) in cases {
            let (mut out, mut err) = (vec![1u8; o], vec![2u8; e]);
            truncate_exec_output(&mut out, &mut err);
            assert_eq!((out.len(), err.len()), want, "from {o}, {e}");
        }
    }
}
