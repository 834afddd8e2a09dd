//! Helpers for tests that need a mount namespace of their own.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::{FromRawFd as _, OwnedFd};

/// Run `f` in a forked child (unshare needs a single-threaded process), in a private mount
/// namespace of its own so the host sees nothing of what it mounts; `None` where a step failed.
pub fn in_child_mount_ns(f: impl FnOnce() -> Option<Vec<bool>>) -> Option<Vec<bool>> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors, which we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: fresh descriptors from pipe2.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child only runs `f` and exits.
    match unsafe { libc::fork() } {
        -1 => None,
        0 => {
            drop(r);
            // SAFETY: plain syscalls with constant arguments.
            let private = unsafe {
                libc::unshare(libc::CLONE_NEWNS) == 0
                    && libc::mount(
                        std::ptr::null(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) == 0
            };
            let out = private.then(f).flatten();
            let bytes: Vec<u8> =
                out.map_or(vec![], |v| v.iter().map(|&b| b'0' + b as u8).collect());
            let _ = File::from(w).write_all(&bytes);
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        child => {
            drop(w);
            let mut out = Vec::new();
            let _ = File::from(r).read_to_end(&mut out);
            // SAFETY: waitpid on our own child.
            unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
            (!out.is_empty()).then(|| out.iter().map(|&b| b == b'1').collect())
        }
    }
}

/// A new empty mount namespace, made in a thread of its own that ends once the caller holds it:
/// the descriptor returned (opened from outside, as the namespace has no `/proc`).
pub fn empty_mount_ns() -> std::io::Result<File> {
    let (made_tx, made_rx) = std::sync::mpsc::channel();
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        // SAFETY: gettid has no arguments.
        let made = crate::empty_ns::make_here().map(|()| unsafe { libc::gettid() });
        let _ = made_tx.send(made);
        let _ = held_rx.recv();
    });
    let opened = made_rx
        .recv()
        .map_err(|_| std::io::Error::other("the thread making an empty mount namespace ended"))
        .and_then(|made| {
            let tid = made?;
            File::open(format!("/proc/self/task/{tid}/ns/mnt"))
        });
    drop(held_tx);
    let _ = thread.join();
    opened
}
