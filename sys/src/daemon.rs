//! Starting a process that outlives its starter (a pod's shim, a lazy layer's FUSE server): fork
//! into a session of its own, and have the starter wait, through a pipe, for the child's report
//! that it is ready, or why it is not. The starter prints the report and exits, so that the
//! caller's spawn returns only once the child can serve.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};

/// Fork. The child starts a new session and runs `child` with the write end of the report
/// pipe (it writes its report there, or drops it to say nothing), then exits with the code
/// `child` returns. The parent reads the report to its end: where `accepted` takes it, it goes
/// to stdout and the parent exits 0; else `<name>: <report>` (or that the child exited before
/// it was ready) goes to stderr and the parent exits 1.
///
/// Call it while single-threaded: the child runs Rust code, which is only sound after a fork
/// when no other thread held a lock.
pub fn fork_with_report(
    name: &str,
    accepted: impl Fn(&str) -> bool,
    child: impl FnOnce(std::fs::File) -> i32,
) -> ! {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, which are owned from here on.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        fail(name, &format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the caller is single-threaded (see above).
    match unsafe { libc::fork() } {
        -1 => fail(name, &format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            drop(r);
            // SAFETY: setsid has no arguments; failing (already a leader) is harmless.
            unsafe { libc::setsid() };
            std::process::exit(child(std::fs::File::from(w)))
        }
        _ => {
            drop(w);
            let mut msg = String::new();
            let _ = std::fs::File::from(r).read_to_string(&mut msg);
            if accepted(&msg) {
                let _ = std::io::stdout().write_all(msg.as_bytes());
                std::process::exit(0);
            }
            fail(
                name,
                if msg.is_empty() {
                    "exited before it was ready"
                } else {
                    msg.trim()
                },
            )
        }
    }
}

fn fail(name: &str, msg: &str) -> ! {
    eprintln!("{name}: {msg}");
    std::process::exit(1)
}
