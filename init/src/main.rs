//! `crishim-init -- CMD ARGS…`: PID 1 for a container whose program does not reap, as
//! `docker run --init` provides. It runs the command as its only direct child, forwards every
//! catchable signal to it, reaps every orphan that the kernel re-parents to PID 1, and exits with
//! the command's status (128 + signal when it was killed).

use std::ffi::CString;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).skip_while(|a| a == "--").collect();
    if args.is_empty() {
        eprintln!("usage: crishim-init -- COMMAND [ARG...]");
        std::process::exit(2);
    }
    let argv: Vec<CString> = match args.iter().map(|a| CString::new(a.as_bytes())).collect() {
        Ok(v) => v,
        Err(_) => {
            eprintln!("crishim-init: argument contains a NUL byte");
            std::process::exit(2);
        }
    };
    // SAFETY: plain libc calls on memory we own; the child only calls async-signal-safe functions
    // (sigprocmask, signal, execvp, _exit) between fork and exec.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_BLOCK, &all, &mut old);
        let child = libc::fork();
        if child < 0 {
            eprintln!("crishim-init: fork: {}", std::io::Error::last_os_error());
            std::process::exit(1);
        }
        if child == 0 {
            libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            // Rust ignores SIGPIPE, and an ignored signal stays ignored across exec.
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
            ptrs.push(std::ptr::null());
            libc::execvp(ptrs[0], ptrs.as_ptr());
            let msg = b"crishim-init: exec failed\n";
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::_exit(127);
        }
        loop {
            let mut sig: libc::c_int = 0;
            if libc::sigwait(&all, &mut sig) != 0 {
                continue;
            }
            if sig != libc::SIGCHLD {
                libc::kill(child, sig);
                continue;
            }
            // Reap everything that has exited; leave when the command itself has.
            loop {
                let mut status = 0;
                let pid = libc::waitpid(-1, &mut status, libc::WNOHANG);
                if pid <= 0 {
                    break;
                }
                if pid == child {
                    let code = if libc::WIFEXITED(status) {
                        libc::WEXITSTATUS(status)
                    } else {
                        128 + libc::WTERMSIG(status)
                    };
                    std::process::exit(code);
                }
            }
        }
    }
}
