//! `crishim-init -- CMD ARGS…`: PID 1 for a container whose program does not reap, as
//! `docker run --init` provides. It runs the command as its only direct child, forwards every
//! catchable signal to it, reaps every orphan that the kernel re-parents to PID 1, and exits with
//! the command's status (128 + signal when it was killed).
//!
//! Either way it first sets the environment values that are not UTF-8, which an OCI spec cannot
//! carry: `CRISHIM_RAW_ENV` holds them, hex-encoded (`crishim_proto::init`). With `--exec` that
//! is all it does: it then execs the command in place.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;

/// `crishim_proto::init::RAW_ENV` (this binary is static and has no dependencies).
const RAW_ENV: &str = "CRISHIM_RAW_ENV";

/// The `KEY=VALUE` entries of `hex`: NUL-separated entries, hex-encoded.
fn raw_entries(hex: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let bytes: Vec<u8> = hex
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect::<Option<_>>()?;
    bytes
        .split(|b| *b == 0)
        .map(|e| {
            let eq = e.iter().position(|b| *b == b'=')?;
            (eq > 0).then(|| (e[..eq].to_vec(), e[eq + 1..].to_vec()))
        })
        .collect()
}

/// Sets the entries of `RAW_ENV`, then unsets it.
fn set_raw_env() {
    let Some(hex) = std::env::var_os(RAW_ENV) else {
        return;
    };
    let Some(entries) = raw_entries(hex.as_bytes()) else {
        eprintln!("crishim-init: {RAW_ENV} is not valid");
        std::process::exit(2);
    };
    // SAFETY: the process has one thread.
    unsafe {
        for (k, v) in entries {
            std::env::set_var(OsStr::from_bytes(&k), OsStr::from_bytes(&v));
        }
        std::env::remove_var(RAW_ENV);
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let exec_only = args.first().is_some_and(|a| a == "--exec");
    if exec_only {
        args.remove(0);
    }
    if args.first().is_some_and(|a| a == "--") {
        args.remove(0);
    }
    if args.is_empty() {
        eprintln!("usage: crishim-init [--exec] -- COMMAND [ARG...]");
        std::process::exit(2);
    }
    set_raw_env();
    let argv: Vec<CString> = match args.iter().map(|a| CString::new(a.as_bytes())).collect() {
        Ok(v) => v,
        Err(_) => {
            eprintln!("crishim-init: argument contains a NUL byte");
            std::process::exit(2);
        }
    };
    if exec_only {
        let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        // SAFETY: NUL-terminated strings we own, in a NULL-terminated array.
        unsafe { libc::execvp(ptrs[0], ptrs.as_ptr()) };
        eprintln!(
            "crishim-init: exec {}: {}",
            args[0],
            std::io::Error::last_os_error()
        );
        std::process::exit(127);
    }
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

#[cfg(test)]
mod tests {
    use super::raw_entries;

    #[test]
    fn raw_entries_decode_exactly_and_nonsense_is_refused() {
        assert_eq!(
            raw_entries(b"413dff00423d63"),
            Some(vec![
                (b"A".to_vec(), vec![0xff]),
                (b"B".to_vec(), b"c".to_vec())
            ])
        );
        assert_eq!(raw_entries(b"413d"), Some(vec![(b"A".to_vec(), vec![])]));
        for bad in [&b"4"[..], b"zz", b"41", b"3d41"] {
            assert_eq!(raw_entries(bad), None, "{bad:?}");
        }
    }
}
