//! containerd's RuntimeDefault seccomp profile (contrib/seccomp): errno for everything but an
//! allow list, widened for the capabilities the container keeps.

use oci_spec::runtime::{
    Arch, Capabilities, Capability, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder,
    LinuxSeccompOperator, LinuxSyscall,
};

/// Allowed for every container. Names the kernel or libseccomp does not know are skipped by
/// the runtime, so newer syscalls can be listed.
#[rustfmt::skip]
const ALLOWED: &[&str] = &[
    "accept", "accept4", "access", "adjtimex", "alarm", "bind", "brk", "cachestat", "capget",
    "capset", "chdir", "chmod", "chown", "chown32", "clock_adjtime", "clock_adjtime64",
    "clock_getres", "clock_getres_time64", "clock_gettime", "clock_gettime64",
    "clock_nanosleep", "clock_nanosleep_time64", "close", "close_range", "connect",
    "copy_file_range", "creat", "dup", "dup2", "dup3", "epoll_create", "epoll_create1",
    "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2", "epoll_wait", "epoll_wait_old",
    "eventfd", "eventfd2", "execve", "execveat", "exit", "exit_group", "faccessat",
    "faccessat2", "fadvise64", "fadvise64_64", "fallocate", "fanotify_mark", "fchdir", "fchmod",
    "fchmodat", "fchmodat2", "fchown", "fchown32", "fchownat", "fcntl", "fcntl64", "fdatasync",
    "fgetxattr", "flistxattr", "flock", "fork", "fremovexattr", "fsetxattr", "fstat", "fstat64",
    "fstatat64", "fstatfs", "fstatfs64", "fsync", "ftruncate", "ftruncate64", "futex",
    "futex_requeue", "futex_time64", "futex_wait", "futex_waitv", "futex_wake", "futimesat",
    "getcpu", "getcwd", "getdents", "getdents64", "getegid", "getegid32", "geteuid",
    "geteuid32", "getgid", "getgid32", "getgroups", "getgroups32", "getitimer", "getpeername",
    "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrandom", "getresgid",
    "getresgid32", "getresuid", "getresuid32", "getrlimit", "get_robust_list", "getrusage",
    "getsid", "getsockname", "getsockopt", "get_thread_area", "gettid", "gettimeofday",
    "getuid", "getuid32", "getxattr", "getxattrat", "inotify_add_watch", "inotify_init",
    "inotify_init1", "inotify_rm_watch", "io_cancel", "ioctl", "io_destroy", "io_getevents",
    "io_pgetevents", "io_pgetevents_time64", "ioprio_get", "ioprio_set", "io_setup",
    "io_submit", "ipc", "kill", "landlock_add_rule", "landlock_create_ruleset",
    "landlock_restrict_self", "lchown", "lchown32", "lgetxattr", "link", "linkat", "listen",
    "listmount", "listxattr", "listxattrat", "llistxattr", "_llseek", "lremovexattr", "lseek",
    "lsetxattr", "lsm_get_self_attr", "lsm_list_modules", "lsm_set_self_attr", "lstat",
    "lstat64", "madvise", "membarrier", "memfd_create", "memfd_secret", "mincore", "mkdir",
    "mkdirat", "mknod", "mknodat", "mlock", "mlock2", "mlockall", "map_shadow_stack", "mmap",
    "mmap2", "mprotect", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive",
    "mq_timedreceive_time64", "mq_timedsend", "mq_timedsend_time64", "mq_unlink", "mremap",
    "mseal", "msgctl", "msgget", "msgrcv", "msgsnd", "msync", "munlock", "munlockall", "munmap",
    "name_to_handle_at", "nanosleep", "newfstatat", "_newselect", "open", "openat", "openat2",
    "pause", "pidfd_open", "pidfd_send_signal", "pipe", "pipe2", "pkey_alloc", "pkey_free",
    "pkey_mprotect", "poll", "ppoll", "ppoll_time64", "prctl", "pread64", "preadv", "preadv2",
    "prlimit64", "process_mrelease", "pselect6", "pselect6_time64", "pwrite64", "pwritev",
    "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv", "recv", "recvfrom",
    "recvmmsg", "recvmmsg_time64", "recvmsg", "remap_file_pages", "removexattr",
    "removexattrat", "rename", "renameat", "renameat2", "restart_syscall", "rmdir", "rseq",
    "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn",
    "rt_sigsuspend", "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_tgsigqueueinfo",
    "sched_getaffinity", "sched_getattr", "sched_getparam", "sched_get_priority_max",
    "sched_get_priority_min", "sched_getscheduler", "sched_rr_get_interval",
    "sched_rr_get_interval_time64", "sched_setaffinity", "sched_setattr", "sched_setparam",
    "sched_setscheduler", "sched_yield", "seccomp", "select", "semctl", "semget", "semop",
    "semtimedop", "semtimedop_time64", "send", "sendfile", "sendfile64", "sendmmsg", "sendmsg",
    "sendto", "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid", "setgid32",
    "setgroups", "setgroups32", "setitimer", "setpgid", "setpriority", "setregid", "setregid32",
    "setresgid", "setresgid32", "setresuid", "setresuid32", "setreuid", "setreuid32",
    "setrlimit", "set_robust_list", "setsid", "setsockopt", "set_thread_area",
    "set_tid_address", "setuid", "setuid32", "setxattr", "setxattrat", "shmat", "shmctl",
    "shmdt", "shmget", "shutdown", "sigaltstack", "signalfd", "signalfd4", "sigprocmask",
    "sigreturn", "socketcall", "socketpair", "splice", "stat", "stat64", "statfs", "statfs64",
    "statmount", "statx", "symlink", "symlinkat", "sync", "sync_file_range", "syncfs",
    "sysinfo", "tee", "tgkill", "time", "timer_create", "timer_delete", "timer_getoverrun",
    "timer_gettime", "timer_gettime64", "timer_settime", "timer_settime64", "timerfd_create",
    "timerfd_gettime", "timerfd_gettime64", "timerfd_settime", "timerfd_settime64", "times",
    "tkill", "truncate", "truncate64", "ugetrlimit", "umask", "uname", "unlink", "unlinkat",
    "uretprobe", "utime", "utimensat", "utimensat_time64", "utimes", "vfork", "vmsplice",
    "wait4", "waitid", "waitpid", "write", "writev",
];

/// Syscalls allowed when the bounding set holds a capability.
const BY_CAPABILITY: &[(Capability, &[&str])] = &[
    (Capability::DacReadSearch, &["open_by_handle_at"]),
    (
        Capability::SysAdmin,
        &[
            "bpf",
            "clone",
            "clone3",
            "fanotify_init",
            "fsconfig",
            "fsmount",
            "fsopen",
            "fspick",
            "lookup_dcookie",
            "mount",
            "mount_setattr",
            "move_mount",
            "open_tree",
            "perf_event_open",
            "quotactl",
            "quotactl_fd",
            "setdomainname",
            "sethostname",
            "setns",
            "syslog",
            "umount",
            "umount2",
            "unshare",
        ],
    ),
    (Capability::SysBoot, &["reboot"]),
    (Capability::SysChroot, &["chroot"]),
    (
        Capability::SysModule,
        &["delete_module", "init_module", "finit_module"],
    ),
    (Capability::SysPacct, &["acct"]),
    (
        Capability::SysPtrace,
        &[
            "kcmp",
            "pidfd_getfd",
            "process_madvise",
            "process_vm_readv",
            "process_vm_writev",
            "ptrace",
        ],
    ),
    (Capability::SysRawio, &["iopl", "ioperm"]),
    (
        Capability::SysTime,
        &["settimeofday", "stime", "clock_settime", "clock_settime64"],
    ),
    (Capability::SysTtyConfig, &["vhangup"]),
    (
        Capability::SysNice,
        &[
            "get_mempolicy",
            "mbind",
            "set_mempolicy",
            "set_mempolicy_home_node",
        ],
    ),
    (Capability::Syslog, &["syslog"]),
    (Capability::Bpf, &["bpf"]),
    (Capability::Perfmon, &["perf_event_open"]),
];

/// personality(2) values a container may set: PER_LINUX, PER_LINUX32, UNAME26 with either, and
/// 0xffffffff to query.
const PERSONALITIES: [u64; 5] = [0x0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

const AF_ALG: u64 = libc::AF_ALG as u64;
const AF_VSOCK: u64 = libc::AF_VSOCK as u64;

/// The CLONE_NEW* flags: without CAP_SYS_ADMIN, clone(2) may not create namespaces.
const CLONE_NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

/// The profile for a container whose bounding set is `bounding`.
pub(super) fn default_profile(bounding: &Capabilities) -> LinuxSeccomp {
    let mut syscalls = vec![allow(ALLOWED)];
    // socket(2) for any family but AF_ALG (38) and AF_VSOCK (40): three single-condition rules,
    // since conditions on one argument within a rule would be split into separate (OR-ed) rules.
    syscalls.push(allow_if(
        "socket",
        0,
        LinuxSeccompOperator::ScmpCmpLt,
        AF_ALG,
    ));
    syscalls.push(allow_if(
        "socket",
        0,
        LinuxSeccompOperator::ScmpCmpEq,
        AF_ALG + 1,
    ));
    syscalls.push(allow_if(
        "socket",
        0,
        LinuxSeccompOperator::ScmpCmpGt,
        AF_VSOCK,
    ));
    for persona in PERSONALITIES {
        syscalls.push(allow_if(
            "personality",
            0,
            LinuxSeccompOperator::ScmpCmpEq,
            persona,
        ));
    }
    // containerd adds these from kernel 4.8 on; openat2, which we need anyway, is from 5.6.
    syscalls.push(allow(&["process_vm_readv", "process_vm_writev", "ptrace"]));
    syscalls.push(allow(ARCH_SPECIFIC));
    for (cap, names) in BY_CAPABILITY {
        if bounding.contains(cap) {
            syscalls.push(allow(names));
        }
    }
    if !bounding.contains(&Capability::SysAdmin) {
        syscalls.push(clone_without_namespaces());
        // ENOSYS rather than EPERM, so that libc falls back to clone(2), which is filtered above
        // (clone3's flags live in memory, out of seccomp's reach).
        let mut clone3 = allow(&["clone3"]);
        clone3
            .set_action(LinuxSeccompAction::ScmpActErrno)
            .set_errno_ret(Some(libc::ENOSYS as u32));
        syscalls.push(clone3);
    }
    let mut profile = LinuxSeccomp::default();
    profile
        .set_default_action(LinuxSeccompAction::ScmpActErrno)
        .set_architectures(Some(ARCHES.to_vec()))
        .set_syscalls(Some(syscalls));
    profile
}

/// clone(2) allowed only if no CLONE_NEW* flag is set: `(flags & CLONE_NEW*) == 0`.
///
/// Written as the OCI runtime spec, runc and containerd's profile mean it: `value` is the mask,
/// `valueTwo` the datum. This is what `config.json` says to every runtime; the shim hands
/// libcontainer (youki 0.7, which reads the two the other way round) a translated copy.
fn clone_without_namespaces() -> LinuxSyscall {
    // s390 passes the flags second.
    let index: usize = if cfg!(target_arch = "s390x") { 1 } else { 0 };
    let arg = LinuxSeccompArgBuilder::default()
        .index(index)
        .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
        .value(CLONE_NAMESPACE_FLAGS)
        .value_two(0u64)
        .build()
        .expect("all fields set");
    let mut rule = allow(&["clone"]);
    rule.set_args(Some(vec![arg]));
    rule
}

fn allow(names: &[&str]) -> LinuxSyscall {
    let mut rule = LinuxSyscall::default();
    rule.set_names(names.iter().map(|n| n.to_string()).collect())
        .set_action(LinuxSeccompAction::ScmpActAllow);
    rule
}

fn allow_if(name: &str, index: usize, op: LinuxSeccompOperator, value: u64) -> LinuxSyscall {
    let arg = LinuxSeccompArgBuilder::default()
        .index(index)
        .op(op)
        .value(value)
        .build()
        .expect("all fields set");
    let mut rule = allow(&[name]);
    rule.set_args(Some(vec![arg]));
    rule
}

#[cfg(target_arch = "x86_64")]
const ARCHES: &[Arch] = &[Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32];
#[cfg(target_arch = "x86_64")]
const ARCH_SPECIFIC: &[&str] = &["arch_prctl", "modify_ldt"];

#[cfg(target_arch = "aarch64")]
const ARCHES: &[Arch] = &[Arch::ScmpArchArm, Arch::ScmpArchAarch64];
#[cfg(target_arch = "aarch64")]
const ARCH_SPECIFIC: &[&str] = &[
    "arm_fadvise64_64",
    "arm_sync_file_range",
    "sync_file_range2",
    "breakpoint",
    "cacheflush",
    "set_tls",
];

#[cfg(target_arch = "s390x")]
const ARCHES: &[Arch] = &[Arch::ScmpArchS390, Arch::ScmpArchS390x];
#[cfg(target_arch = "s390x")]
const ARCH_SPECIFIC: &[&str] = &[
    "s390_pci_mmio_read",
    "s390_pci_mmio_write",
    "s390_runtime_instr",
];

#[cfg(target_arch = "riscv64")]
const ARCHES: &[Arch] = &[Arch::ScmpArchRiscv64];
#[cfg(target_arch = "riscv64")]
const ARCH_SPECIFIC: &[&str] = &["riscv_flush_icache", "riscv_hwprobe"];

#[cfg(target_arch = "powerpc64")]
const ARCHES: &[Arch] = &[];
#[cfg(target_arch = "powerpc64")]
const ARCH_SPECIFIC: &[&str] = &["sync_file_range2", "swapcontext"];

#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "s390x",
    target_arch = "riscv64",
    target_arch = "powerpc64"
)))]
const ARCHES: &[Arch] = &[];
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "s390x",
    target_arch = "riscv64",
    target_arch = "powerpc64"
)))]
const ARCH_SPECIFIC: &[&str] = &[];
