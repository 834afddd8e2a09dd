//! The pod's infra process: crishim's own "pause". It is cloned into the pod's new namespaces, sets
//! the hostname and brings loopback up, then execs `crishim-shim infra`, which only waits: it pins
//! the namespaces, and as PID 1 of a shared pid namespace it reaps every orphan.

use std::ffi::CString;

use crishim_proto::shim::InfraSpec;
use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};

/// Clone the infra process into new namespaces; returns its pid (in our pid namespace).
pub fn spawn(spec: &InfraSpec) -> Result<i32, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding own executable: {e}"))?;
    let exe = CString::new(exe.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    let argv = [
        CString::new("crishim-shim").unwrap(),
        CString::new("infra").unwrap(),
    ];
    let hostname = spec.hostname.clone();
    let mut flags = CloneFlags::empty();
    for (on, f) in [
        (spec.net, CloneFlags::CLONE_NEWNET),
        (spec.ipc, CloneFlags::CLONE_NEWIPC),
        (spec.uts, CloneFlags::CLONE_NEWUTS),
        (spec.pid, CloneFlags::CLONE_NEWPID),
    ] {
        if on {
            flags |= f;
        }
    }
    let net = spec.net;
    let uts = spec.uts;
    let mut stack = vec![0u8; 64 * 1024];
    let child = Box::new(move || -> isize {
        if uts && !hostname.is_empty() && nix::unistd::sethostname(&hostname).is_err() {
            return 10;
        }
        if net {
            loopback_up();
        }
        let _ = nix::unistd::execv(&exe, &argv);
        11
    });
    // SAFETY: the shim is single-threaded here; the child runs only the closure above, then execs.
    let pid = unsafe { nix::sched::clone(child, &mut stack, flags, Some(Signal::SIGCHLD as i32)) }
        .map_err(|e| format!("clone infra process ({flags:?}): {e}"))?;
    Ok(pid.as_raw())
}

/// `ip link set lo up`, with one ioctl, in the new network namespace.
fn loopback_up() {
    // SAFETY: plain socket/ioctl calls on a zeroed ifreq we own.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return;
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) == 0 {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
        }
        libc::close(fd);
    }
}

/// Infra main loop: wait for signals; reap on SIGCHLD; exit cleanly on SIGTERM or SIGINT.
pub fn run() -> ! {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        set.add(s);
    }
    // PID 1 ignores signals it has no handler for; blocking them and waiting makes them arrive.
    let _ = set.thread_block();
    loop {
        match set.wait() {
            Ok(Signal::SIGCHLD) => reap_all(),
            Ok(Signal::SIGTERM) | Ok(Signal::SIGINT) => std::process::exit(0),
            _ => {}
        }
    }
}

fn reap_all() {
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}
