//! The infra process's seccomp filter: a classic BPF program, written out here rather than compiled
//! by libseccomp, so a pod's start costs no libseccomp work and no memory for it.
//!
//! The infra process only waits for signals and reaps; those are the calls the filter lets through
//! (glibc's `sigwait` is `rt_sigtimedwait`, `waitpid` is `wait4`, `_exit` is `exit_group`), plus
//! `waitid`, `exit`, `rt_sigreturn` and `restart_syscall`, which libc or the kernel may issue.
//! `strace -f -p` of a shared-pid pod's infra while orphans exit shows only `rt_sigtimedwait` and
//! `wait4`. Everything else (mounts, capabilities, closing descriptors) happens before the filter
//! is loaded. Any other call, a foreign architecture or an x32 call kills the
//! process: it can only mean the process was subverted (say through `ptrace` by a container with
//! `CAP_SYS_PTRACE`), and an error code would leave a subverted loop running. Its death is logged by
//! the shim, and the pod's namespaces stay pinned by the containers in them.

use std::io;

/// `AUDIT_ARCH_*` of the architecture we were built for (`<linux/audit.h>`).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// x32 system calls are x86_64 numbers with this bit set; they are never allowed.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Offsets in `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

const LD_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
#[cfg(target_arch = "x86_64")]
const JSET: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// What the wait loop calls, and what the kernel or libc may call around it.
pub const ALLOWED: &[libc::c_long] = &[
    libc::SYS_rt_sigtimedwait, // sigwait
    libc::SYS_wait4,           // waitpid
    libc::SYS_waitid,
    libc::SYS_rt_sigreturn, // after a handled signal (the shim's SIGPIPE handler)
    libc::SYS_restart_syscall,
    libc::SYS_exit_group,
    libc::SYS_exit,
];

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The program: check the architecture, refuse x32, allow [`ALLOWED`], kill on anything else.
pub fn program() -> Vec<libc::sock_filter> {
    let mut p = Vec::with_capacity(ALLOWED.len() + 6);
    // Jump offsets are filled in once the length is known: KILL is the next-to-last
    // instruction, ALLOW the last.
    p.push(stmt(LD_ABS, DATA_ARCH));
    p.push(jump(JEQ, AUDIT_ARCH, 0, u8::MAX)); // jf: to KILL
    p.push(stmt(LD_ABS, DATA_NR));
    #[cfg(target_arch = "x86_64")]
    p.push(jump(JSET, X32_SYSCALL_BIT, u8::MAX, 0)); // jt: to KILL
    for nr in ALLOWED {
        p.push(jump(JEQ, *nr as u32, u8::MAX - 1, 0)); // jt: to ALLOW
    }
    p.push(stmt(RET, libc::SECCOMP_RET_KILL_PROCESS));
    p.push(stmt(RET, libc::SECCOMP_RET_ALLOW));
    let (kill, allow) = (p.len() - 2, p.len() - 1);
    for (i, ins) in p.iter_mut().enumerate() {
        let to = |target: usize| u8::try_from(target - i - 1).expect("a short program");
        if ins.jf == u8::MAX {
            ins.jf = to(kill);
        }
        if ins.jt == u8::MAX {
            ins.jt = to(kill);
        } else if ins.jt == u8::MAX - 1 {
            ins.jt = to(allow);
        }
    }
    p
}

/// Load `program` for this thread (the only one). Needs `no_new_privs` or `CAP_SYS_ADMIN`.
pub fn load(program: &mut [libc::sock_filter]) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: `prog` points at a live program for the duration of the call; the kernel copies it.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program over one `seccomp_data` (nr, arch) the way the kernel would.
    fn verdict(p: &[libc::sock_filter], nr: u32, arch: u32) -> u32 {
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let ins = p[pc];
            pc += 1;
            match ins.code {
                LD_ABS if ins.k == DATA_NR => acc = nr,
                LD_ABS if ins.k == DATA_ARCH => acc = arch,
                JEQ => pc += usize::from(if acc == ins.k { ins.jt } else { ins.jf }),
                #[cfg(target_arch = "x86_64")]
                JSET => pc += usize::from(if acc & ins.k != 0 { ins.jt } else { ins.jf }),
                RET => return ins.k,
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    #[test]
    fn only_the_wait_loop_calls_pass() {
        let p = program();
        for nr in ALLOWED {
            assert_eq!(
                verdict(&p, *nr as u32, AUDIT_ARCH),
                libc::SECCOMP_RET_ALLOW,
                "{nr}"
            );
        }
        for nr in [
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_ptrace,
            libc::SYS_mount,
            libc::SYS_setns,
            libc::SYS_write,
            libc::SYS_read,
        ] {
            assert_eq!(
                verdict(&p, nr as u32, AUDIT_ARCH),
                libc::SECCOMP_RET_KILL_PROCESS,
                "{nr}"
            );
        }
        // Another architecture's numbers mean other calls: refused whatever the number.
        assert_eq!(
            verdict(&p, libc::SYS_wait4 as u32, 0x4000_0003),
            libc::SECCOMP_RET_KILL_PROCESS
        );
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            verdict(&p, libc::SYS_wait4 as u32 | X32_SYSCALL_BIT, AUDIT_ARCH),
            libc::SECCOMP_RET_KILL_PROCESS
        );
    }
}
