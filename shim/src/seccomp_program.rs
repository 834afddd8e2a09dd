//! Seccomp profiles compiled to BPF once per node, not once per container or exec'd process.
//!
//! libseccomp builds the BPF program from the profile every time a filter is loaded, which costs
//! a container's init or an exec'd process more than the rest of its start. A shim
//! compiles each distinct profile once with libseccomp's own generator (`seccomp_export_bpf`,
//! the program `seccomp_load` would install) and keeps it, in memory and in the daemon's
//! cache directory (`<state_dir>/seccomp`, root's alone), where the next pod's shim finds it.
//! The process then loads that program with `seccomp(SECCOMP_SET_MODE_FILTER)` and the flags
//! libseccomp would pass. The rules are added as libcontainer adds them (the reference path,
//! which `crishim bundle` still uses), so both paths install the same program; the
//! `security` tests read both back with `PTRACE_SECCOMP_GET_FILTER` and compare them.
//!
//! One reading of `SCMP_CMP_MASKED_EQ`: the OCI runtime spec's, runc's and containerd's, where
//! `value` is the mask and `valueTwo` the datum (`(arg & value) == valueTwo`). Every profile a
//! bundle holds means that, whichever runtime runs it. libcontainer 0.7 reads the two the other
//! way round, so wherever it still loads a filter itself it gets [`for_libcontainer`]'s copy.
//!
//! Profiles with a `SCMP_ACT_NOTIFY` rule or `SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV` are not
//! compiled here (they need a listener fd): those go through libcontainer as before.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use libseccomp::{
    ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall,
};
use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction as Act, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompFilterFlag as Flag, LinuxSeccompOperator as Op,
};

/// Distinct profiles one shim keeps programs for; past that the cache starts again.
const MAX_CACHED: usize = 16;

/// A compiled filter: classic BPF instructions and the `seccomp(2)` flags to load them with.
#[derive(Debug, PartialEq, Eq)]
pub struct Program {
    filter: Vec<libc::sock_filter>,
    flags: libc::c_ulong,
}

impl Program {
    /// Install the filter on the calling thread (and, with `TSYNC`, its process).
    pub fn load(&self) -> std::io::Result<()> {
        let prog = libc::sock_fprog {
            len: u16::try_from(self.filter.len())
                .map_err(|_| std::io::Error::other("seccomp program too long"))?,
            filter: self.filter.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: `prog` points at `len` instructions that live for the call; the kernel copies
        // them.
        let r = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                self.flags,
                &prog as *const libc::sock_fprog,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

thread_local! {
    /// The shim is single-threaded: one cache, keyed by a SHA-256 of the profile's JSON (not the
    /// JSON itself: RuntimeDefault's is some 10 KiB, kept by every pod's shim).
    static PROGRAMS: RefCell<HashMap<[u8; 32], Arc<Program>>> = RefCell::new(HashMap::new());
    /// Where compiled programs are kept for other shims (`--seccomp-cache`); none: memory only.
    static DISK: RefCell<Option<std::path::PathBuf>> = const { RefCell::new(None) };
}

/// Keep compiled programs in `dir` too, and look there first.
pub fn set_disk_cache(dir: std::path::PathBuf) {
    DISK.with(|d| *d.borrow_mut() = Some(dir));
}

/// The most instructions a filter may have (`BPF_MAXINSNS`).
const MAX_INSNS: usize = 4096;

// `c_ulong` is `u64` here and `u32` on 32-bit targets: the conversions are not useless there.
#[allow(clippy::useless_conversion)]
impl Program {
    /// `flags` (8 bytes, little-endian), then the instructions as the kernel takes them.
    fn to_bytes(&self) -> Vec<u8> {
        let mut out = u64::from(self.flags).to_le_bytes().to_vec();
        for i in &self.filter {
            out.extend(i.code.to_ne_bytes());
            out.extend([i.jt, i.jf]);
            out.extend(i.k.to_ne_bytes());
        }
        out
    }

    /// What [`Self::to_bytes`] wrote; `None` for anything else (a torn or foreign file).
    fn from_bytes(b: &[u8]) -> Option<Program> {
        let (flags, insns) = b.split_at_checked(8)?;
        if insns.is_empty() || insns.len() % 8 != 0 || insns.len() / 8 > MAX_INSNS {
            return None;
        }
        let flags = u64::from_le_bytes(flags.try_into().ok()?);
        let known = libc::SECCOMP_FILTER_FLAG_LOG
            | libc::SECCOMP_FILTER_FLAG_TSYNC
            | libc::SECCOMP_FILTER_FLAG_SPEC_ALLOW;
        if flags & !u64::from(known) != 0 {
            return None;
        }
        Some(Program {
            flags: libc::c_ulong::try_from(flags).ok()?,
            filter: insns
                .chunks_exact(8)
                .map(|c| libc::sock_filter {
                    code: u16::from_ne_bytes([c[0], c[1]]),
                    jt: c[2],
                    jf: c[3],
                    k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
                })
                .collect(),
        })
    }
}

/// The cache file of a profile: named by a SHA-256 of the profile and of what compiled it (a
/// newer libseccomp or shim may compile differently).
fn disk_path(dir: &std::path::Path, key: &str) -> std::path::PathBuf {
    use sha2::Digest as _;
    let v = libseccomp::ScmpVersion::current().ok();
    // Programs compiled before masked comparisons were read the OCI way must not be found.
    let who = format!(
        "crishim-shim {} libseccomp {:?} masked-eq value=mask\n",
        env!("CARGO_PKG_VERSION"),
        v.map(|v| (v.major, v.minor, v.micro))
    );
    let mut h = sha2::Sha256::new();
    h.update(who.as_bytes());
    h.update(key.as_bytes());
    dir.join(format!("{}.bpf", hex::encode(h.finalize())))
}

fn read_disk(key: &str) -> Option<Program> {
    let dir = DISK.with(|d| d.borrow().clone())?;
    let raw = std::fs::read(disk_path(&dir, key)).ok()?;
    Program::from_bytes(&raw)
}

fn write_disk(key: &str, program: &Program) {
    let Some(dir) = DISK.with(|d| d.borrow().clone()) else {
        return;
    };
    let written = crishim_sys::hostfs::create_private_dir(&dir).and_then(|()| {
        crishim_sys::record::write_atomic(&disk_path(&dir, key), &program.to_bytes())
    });
    if let Err(e) = written {
        eprintln!("crishim-shim: keeping a compiled seccomp program: {e}");
    }
}

/// The program for `profile`, compiled on first use; `None` for profiles left to libcontainer.
pub fn cached(profile: &LinuxSeccomp) -> Result<Option<Arc<Program>>, String> {
    if !compilable(profile) {
        return Ok(None);
    }
    let key = serde_json::to_string(profile).map_err(|e| e.to_string())?;
    let digest: [u8; 32] = {
        use sha2::Digest as _;
        sha2::Sha256::digest(key.as_bytes()).into()
    };
    if let Some(p) = PROGRAMS.with(|c| c.borrow().get(&digest).cloned()) {
        return Ok(Some(p));
    }
    let program = match read_disk(&key) {
        Some(p) => Arc::new(p),
        None => {
            let p = compile(profile)?;
            write_disk(&key, &p);
            Arc::new(p)
        }
    };
    PROGRAMS.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= MAX_CACHED {
            c.clear();
        }
        c.insert(digest, program.clone());
    });
    Ok(Some(program))
}

fn compilable(profile: &LinuxSeccomp) -> bool {
    let notify = profile.default_action() == Act::ScmpActNotify
        || profile
            .syscalls()
            .iter()
            .flatten()
            .any(|s| s.action() == Act::ScmpActNotify);
    let killable = profile
        .flags()
        .iter()
        .flatten()
        .any(|f| *f == Flag::SeccompFilterFlagWaitKillableRecv);
    !notify && !killable
}

/// Build `profile`'s program with libseccomp, rule for rule as libcontainer does.
pub fn compile(profile: &LinuxSeccomp) -> Result<Program, String> {
    let err = |what: &str, e: libseccomp::error::SeccompError| format!("{what}: {e}");
    let default = action(profile.default_action(), profile.default_errno_ret())?;
    let mut ctx = ScmpFilterContext::new(default).map_err(|e| err("new filter", e))?;
    let mut flags: libc::c_ulong = 0;
    for f in profile.flags().iter().flatten() {
        flags |= match f {
            Flag::SeccompFilterFlagLog => libc::SECCOMP_FILTER_FLAG_LOG,
            Flag::SeccompFilterFlagTsync => libc::SECCOMP_FILTER_FLAG_TSYNC,
            Flag::SeccompFilterFlagSpecAllow => libc::SECCOMP_FILTER_FLAG_SPEC_ALLOW,
            Flag::SeccompFilterFlagWaitKillableRecv => {
                return Err("WAIT_KILLABLE_RECV needs a notify listener".into())
            }
        };
    }
    for a in profile.architectures().iter().flatten() {
        ctx.add_arch(arch(*a))
            .map_err(|e| err("adding an architecture", e))?;
    }
    for rule in profile.syscalls().iter().flatten() {
        let act = action(rule.action(), rule.errno_ret())?;
        // A rule that does what the default does is redundant (and libseccomp refuses it).
        if act == default {
            continue;
        }
        for name in rule.names() {
            // A name this kernel's libseccomp does not know: nothing to filter.
            let Ok(nr) = ScmpSyscall::from_name(name) else {
                continue;
            };
            let Some(args) = rule.args() else {
                ctx.add_rule(act, nr).map_err(|e| err("adding a rule", e))?;
                continue;
            };
            let cmps: Vec<ScmpArgCompare> = args.iter().map(compare).collect();
            let mut indexes: Vec<usize> = args.iter().map(|a| a.index()).collect();
            indexes.sort_unstable();
            indexes.dedup();
            if indexes.len() == args.len() {
                ctx.add_rule_conditional(act, nr, &cmps)
                    .map_err(|e| err("adding a conditional rule", e))?;
            } else {
                // One argument compared twice: one rule per comparison (runc's way too).
                for c in &cmps {
                    ctx.add_rule_conditional(act, nr, std::slice::from_ref(c))
                        .map_err(|e| err("adding a conditional rule", e))?;
                }
            }
        }
    }
    let bytes = export(&ctx)?;
    let size = std::mem::size_of::<libc::sock_filter>();
    if bytes.len() % size != 0 {
        return Err(format!("libseccomp exported {} bytes of BPF", bytes.len()));
    }
    let filter = bytes
        .chunks_exact(size)
        .map(|c| libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    Ok(Program { filter, flags })
}

/// The program as `seccomp_export_bpf` writes it (through a memfd: Debian 12's libseccomp 2.5
/// has no in-memory export).
fn export(ctx: &ScmpFilterContext) -> Result<Vec<u8>, String> {
    use std::io::{Read, Seek};
    use std::os::fd::FromRawFd;
    // SAFETY: a NUL-terminated name and flags; the fd is owned below.
    let fd = unsafe { libc::memfd_create(c"crishim-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    ctx.export_bpf(&file)
        .map_err(|e| format!("exporting BPF: {e}"))?;
    let mut bytes = Vec::new();
    file.rewind()
        .and_then(|_| file.read_to_end(&mut bytes))
        .map_err(|e| format!("reading the exported BPF: {e}"))?;
    Ok(bytes)
}

fn action(a: Act, errno: Option<u32>) -> Result<ScmpAction, String> {
    let errno = errno.map_or(libc::EPERM, |e| e as i32);
    Ok(match a {
        Act::ScmpActKill | Act::ScmpActKillThread => ScmpAction::KillThread,
        Act::ScmpActKillProcess => ScmpAction::KillProcess,
        Act::ScmpActTrap => ScmpAction::Trap,
        Act::ScmpActErrno => ScmpAction::Errno(errno),
        Act::ScmpActTrace => ScmpAction::Trace(
            u16::try_from(errno).map_err(|_| format!("SCMP_ACT_TRACE value {errno}"))?,
        ),
        Act::ScmpActAllow => ScmpAction::Allow,
        Act::ScmpActLog => ScmpAction::Log,
        Act::ScmpActNotify => return Err("SCMP_ACT_NOTIFY is not compiled here".into()),
    })
}

/// One argument comparison, read as the OCI runtime spec (and runc) reads it: for
/// `SCMP_CMP_MASKED_EQ`, `value` is the mask and `valueTwo` the datum; otherwise `value` is the
/// datum.
fn compare(a: &LinuxSeccompArg) -> ScmpArgCompare {
    let index = a.index() as u32;
    let op = match a.op() {
        Op::ScmpCmpNe => ScmpCompareOp::NotEqual,
        Op::ScmpCmpLt => ScmpCompareOp::Less,
        Op::ScmpCmpLe => ScmpCompareOp::LessOrEqual,
        Op::ScmpCmpEq => ScmpCompareOp::Equal,
        Op::ScmpCmpGe => ScmpCompareOp::GreaterEqual,
        Op::ScmpCmpGt => ScmpCompareOp::Greater,
        Op::ScmpCmpMaskedEq => {
            return ScmpArgCompare::new(
                index,
                ScmpCompareOp::MaskedEqual(a.value()),
                a.value_two().unwrap_or(0),
            )
        }
    };
    ScmpArgCompare::new(index, op, a.value())
}

/// `profile` as libcontainer 0.7 must be handed it to mean what it says: libcontainer passes
/// `valueTwo` to libseccomp as the mask and `value` as the datum, the reverse of the OCI order,
/// so each `SCMP_CMP_MASKED_EQ` comparison has the two swapped (a missing `valueTwo` is 0).
/// `None` when the profile has no masked comparison: libcontainer reads it as it is.
pub fn for_libcontainer(profile: &LinuxSeccomp) -> Option<LinuxSeccomp> {
    let masked = |a: &LinuxSeccompArg| a.op() == Op::ScmpCmpMaskedEq;
    let any = profile
        .syscalls()
        .iter()
        .flatten()
        .filter_map(|r| r.args().as_ref())
        .flatten()
        .any(masked);
    if !any {
        return None;
    }
    let mut out = profile.clone();
    let rules = profile.syscalls().iter().flatten().map(|rule| {
        let mut rule = rule.clone();
        if let Some(args) = rule.args().clone() {
            let swapped = args
                .into_iter()
                .map(|a| {
                    if !masked(&a) {
                        return a;
                    }
                    LinuxSeccompArgBuilder::default()
                        .index(a.index())
                        .op(a.op())
                        .value(a.value_two().unwrap_or(0))
                        .value_two(a.value())
                        .build()
                        .expect("all fields set")
                })
                .collect();
            rule.set_args(Some(swapped));
        }
        rule
    });
    out.set_syscalls(Some(rules.collect()));
    Some(out)
}

fn arch(a: Arch) -> ScmpArch {
    match a {
        Arch::ScmpArchNative => ScmpArch::Native,
        Arch::ScmpArchX86 => ScmpArch::X86,
        Arch::ScmpArchX86_64 => ScmpArch::X8664,
        Arch::ScmpArchX32 => ScmpArch::X32,
        Arch::ScmpArchArm => ScmpArch::Arm,
        Arch::ScmpArchAarch64 => ScmpArch::Aarch64,
        Arch::ScmpArchMips => ScmpArch::Mips,
        Arch::ScmpArchMips64 => ScmpArch::Mips64,
        Arch::ScmpArchMips64n32 => ScmpArch::Mips64N32,
        Arch::ScmpArchMipsel => ScmpArch::Mipsel,
        Arch::ScmpArchMipsel64 => ScmpArch::Mipsel64,
        Arch::ScmpArchMipsel64n32 => ScmpArch::Mipsel64N32,
        Arch::ScmpArchPpc => ScmpArch::Ppc,
        Arch::ScmpArchPpc64 => ScmpArch::Ppc64,
        Arch::ScmpArchPpc64le => ScmpArch::Ppc64Le,
        Arch::ScmpArchS390 => ScmpArch::S390,
        Arch::ScmpArchS390x => ScmpArch::S390X,
        Arch::ScmpArchRiscv64 => ScmpArch::Riscv64,
        Arch::ScmpArchParisc => ScmpArch::Parisc,
        Arch::ScmpArchParisc64 => ScmpArch::Parisc64,
        Arch::ScmpArchLoongarch64 => ScmpArch::Loongarch64,
        Arch::ScmpArchM68k => ScmpArch::M68k,
        Arch::ScmpArchSh => ScmpArch::Sh,
        Arch::ScmpArchSheb => ScmpArch::Sheb,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{LinuxSeccompBuilder, LinuxSyscallBuilder};

    #[test]
    fn programs_round_trip_through_their_cache_file_and_torn_ones_are_refused() {
        let profile = LinuxSeccompBuilder::default()
            .default_action(Act::ScmpActAllow)
            .syscalls(vec![LinuxSyscallBuilder::default()
                .names(vec!["unshare".to_string()])
                .action(Act::ScmpActErrno)
                .build()
                .unwrap()])
            .build()
            .unwrap();
        let p = compile(&profile).unwrap();
        let bytes = p.to_bytes();
        assert_eq!(
            Program::from_bytes(&bytes),
            Some(compile(&profile).unwrap())
        );
        assert_eq!(Program::from_bytes(&bytes[..bytes.len() - 3]), None);
        assert_eq!(Program::from_bytes(&bytes[..8]), None, "no instructions");
        let mut odd_flags = bytes.clone();
        odd_flags[7] = 0x80;
        assert_eq!(Program::from_bytes(&odd_flags), None);
        let huge = [bytes[..8].to_vec(), vec![0u8; (MAX_INSNS + 1) * 8]].concat();
        assert_eq!(Program::from_bytes(&huge), None);
        // Another shim finds it on disk; a corrupt file is compiled afresh.
        let dir = tempfile::tempdir().unwrap();
        set_disk_cache(dir.path().to_path_buf());
        let key = serde_json::to_string(&profile).unwrap();
        write_disk(&key, &p);
        assert_eq!(read_disk(&key), Some(compile(&profile).unwrap()));
        std::fs::write(disk_path(dir.path(), &key), b"junk").unwrap();
        assert_eq!(read_disk(&key), None);
        DISK.with(|d| *d.borrow_mut() = None);
    }

    fn profile(errno: u32) -> LinuxSeccomp {
        LinuxSeccompBuilder::default()
            .default_action(Act::ScmpActAllow)
            .architectures(vec![Arch::ScmpArchX86_64])
            .flags(vec![Flag::SeccompFilterFlagSpecAllow])
            .syscalls(vec![
                LinuxSyscallBuilder::default()
                    .names(vec!["unshare".to_string(), "no_such_call".to_string()])
                    .action(Act::ScmpActErrno)
                    .errno_ret(errno)
                    .build()
                    .unwrap(),
                LinuxSyscallBuilder::default()
                    .names(vec!["personality".to_string()])
                    .action(Act::ScmpActErrno)
                    .args(vec![
                        LinuxSeccompArgBuilder::default()
                            .index(0usize)
                            .value(8u64)
                            .op(Op::ScmpCmpNe)
                            .build()
                            .unwrap(),
                        LinuxSeccompArgBuilder::default()
                            .index(0usize)
                            .value(0x20008u64)
                            .op(Op::ScmpCmpNe)
                            .build()
                            .unwrap(),
                    ])
                    .build()
                    .unwrap(),
            ])
            .build()
            .unwrap()
    }

    #[test]
    fn a_profile_compiles_once_per_content_with_its_flags() {
        let p = compile(&profile(1)).unwrap();
        assert!(p.filter.len() > 4, "{p:?}");
        assert_eq!(p.flags, libc::SECCOMP_FILTER_FLAG_SPEC_ALLOW);
        assert_ne!(
            compile(&profile(2)).unwrap(),
            p,
            "the errno is in the program"
        );
        let a = cached(&profile(1)).unwrap().unwrap();
        let b = cached(&profile(1)).unwrap().unwrap();
        assert!(Arc::ptr_eq(&a, &b), "compiled once");
        assert_eq!(*a, p);
    }

    #[test]
    fn notify_profiles_are_left_to_libcontainer() {
        let mut p = profile(1);
        p.set_default_action(Act::ScmpActNotify);
        assert!(cached(&p).unwrap().is_none());
        let mut p = profile(1);
        p.set_flags(Some(vec![Flag::SeccompFilterFlagWaitKillableRecv]));
        assert!(cached(&p).unwrap().is_none());
    }

    const NEWUSER: u64 = libc::CLONE_NEWUSER as u64;
    const NEWNET: u64 = libc::CLONE_NEWNET as u64;

    /// containerd's clone rule, for `unshare`: refuse (EXDEV) but for `unshare` without
    /// NEWUSER or NEWNET, written the OCI way (`value` the mask NEWUSER|NEWNET, `valueTwo` the
    /// datum 0). Read the other way round the mask is 0: an unconditional allow. Also allowed:
    /// what the child needs after the load to exit, and personality(8) (a plain comparison).
    fn masked_profile() -> LinuxSeccomp {
        let allow = |names: &[&str], args: Option<LinuxSeccompArg>| {
            let mut r = LinuxSyscallBuilder::default()
                .names(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .action(Act::ScmpActAllow)
                .build()
                .unwrap();
            r.set_args(args.map(|a| vec![a]));
            r
        };
        let arg = |op, value: u64, value_two: u64| {
            LinuxSeccompArgBuilder::default()
                .index(0usize)
                .op(op)
                .value(value)
                .value_two(value_two)
                .build()
                .unwrap()
        };
        LinuxSeccompBuilder::default()
            .default_action(Act::ScmpActErrno)
            .default_errno_ret(libc::EXDEV as u32)
            .syscalls(vec![
                allow(
                    &["unshare"],
                    Some(arg(Op::ScmpCmpMaskedEq, NEWUSER | NEWNET, 0)),
                ),
                allow(&["personality"], Some(arg(Op::ScmpCmpEq, 8, 0))),
                allow(
                    &[
                        "exit",
                        "exit_group",
                        "brk",
                        "mmap",
                        "munmap",
                        "madvise",
                        "futex",
                    ],
                    None,
                ),
            ])
            .build()
            .unwrap()
    }

    #[test]
    fn libcontainer_gets_masked_comparisons_with_mask_and_datum_swapped() {
        let p = masked_profile();
        let t = for_libcontainer(&p).unwrap();
        let args = |s: &LinuxSeccomp, i: usize| s.syscalls().as_ref().unwrap()[i].args().clone();
        let masked = args(&t, 0).unwrap()[0];
        assert_eq!(
            (masked.value(), masked.value_two()),
            (0, Some(NEWUSER | NEWNET))
        );
        assert_eq!(args(&t, 1), args(&p, 1), "only masked comparisons change");
        assert_eq!(args(&t, 2), None);
        assert_eq!(
            (t.default_action(), t.default_errno_ret()),
            (p.default_action(), p.default_errno_ret())
        );
        // A missing valueTwo is a zero datum: it becomes libcontainer's zero datum.
        let mut rules = p.syscalls().clone().unwrap();
        rules[0].set_args(Some(vec![LinuxSeccompArgBuilder::default()
            .index(0usize)
            .value(NEWUSER)
            .op(Op::ScmpCmpMaskedEq)
            .build()
            .unwrap()]));
        let mut no_two = p.clone();
        no_two.set_syscalls(Some(rules));
        let t = for_libcontainer(&no_two).unwrap();
        let masked = args(&t, 0).unwrap()[0];
        assert_eq!((masked.value(), masked.value_two()), (0, Some(NEWUSER)));
        // Nothing to translate: libcontainer reads it as it is.
        assert_eq!(for_libcontainer(&profile(1)), None);
    }

    /// `unshare(CLONE_NEWUSER)` in a forked child after `load` put a filter in: its errno, or 0.
    fn unshare_errno_under(load: impl FnOnce() -> bool) -> i32 {
        // SAFETY: the child makes the calls and _exits; glibc's fork leaves malloc usable.
        match unsafe { libc::fork() } {
            0 => {
                // SAFETY: prctl with integer arguments.
                unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
                let code = if load() {
                    // SAFETY: unshare with a flag, in a child that only exits after.
                    let r = unsafe { libc::unshare(libc::CLONE_NEWUSER) };
                    let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                    if r == 0 {
                        0
                    } else {
                        e
                    }
                } else {
                    255
                };
                // SAFETY: ends the forked child at once.
                unsafe { libc::_exit(code) }
            }
            pid => {
                let mut status = 0;
                // SAFETY: waiting for our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                assert!(libc::WIFEXITED(status), "{status}");
                let code = libc::WEXITSTATUS(status);
                assert_ne!(code, 255, "loading the filter failed");
                code
            }
        }
    }

    /// The kernel's verdict: the compiled program and libcontainer's, from the translated copy,
    /// both read `value` as the mask; libcontainer handed the profile as it is does not.
    #[test]
    fn masked_comparisons_mean_the_oci_order_in_the_program_and_through_libcontainer() {
        let p = masked_profile();
        let program = compile(&p).unwrap();
        assert_eq!(
            unshare_errno_under(|| program.load().is_ok()),
            libc::EXDEV,
            "the compiled program"
        );
        let translated = for_libcontainer(&p).unwrap();
        let through_libcontainer = |profile: LinuxSeccomp| {
            unshare_errno_under(move || libcontainer::seccomp::initialize_seccomp(&profile).is_ok())
        };
        assert_eq!(
            through_libcontainer(translated),
            libc::EXDEV,
            "libcontainer given the translated copy"
        );
        assert_ne!(
            through_libcontainer(p),
            libc::EXDEV,
            "libcontainer reads the untranslated profile the other way round (a zero mask)"
        );
    }

    /// In a forked child: the loaded program refuses `unshare` with the profile's errno.
    #[test]
    fn the_loaded_program_refuses_what_the_profile_refuses() {
        let p = compile(&profile(libc::EXDEV as u32)).unwrap();
        // SAFETY: the child only makes async-signal-safe calls before _exit.
        match unsafe { libc::fork() } {
            0 => {
                let code = (|| {
                    // SAFETY: prctl with integer arguments.
                    unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
                    if p.load().is_err() {
                        return 2;
                    }
                    // SAFETY: unshare with a flag; refused by the filter.
                    let r = unsafe { libc::unshare(libc::CLONE_NEWUTS) };
                    let e = std::io::Error::last_os_error().raw_os_error();
                    if r == -1 && e == Some(libc::EXDEV) {
                        0
                    } else {
                        3
                    }
                })();
                // SAFETY: ends the forked child at once.
                unsafe { libc::_exit(code) }
            }
            pid => {
                let mut status = 0;
                // SAFETY: waiting for our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                assert!(libc::WIFEXITED(status), "{status}");
                assert_eq!(
                    libc::WEXITSTATUS(status),
                    0,
                    "2: load failed, 3: not refused"
                );
            }
        }
    }
}
