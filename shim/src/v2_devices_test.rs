//! The cgroup v2 device filter that libcontainer attaches on v2 nodes (an eBPF program, built
//! with its `cgroupsv2_devices` feature), checked against this kernel. A hybrid host mounts a
//! cgroup2 hierarchy too, and the kernel enforces device programs attached there.

use std::ffi::CString;

use libcgroups::v2::devices::bpf::{prog, BpfError};
use libcgroups::v2::devices::controller::DevicesControllerError;
use libcgroups::v2::devices::emulator::Emulator;
use libcgroups::v2::devices::program::Program;
use libcgroups::v2::devices::Devices;
use oci_spec::runtime::LinuxDeviceCgroup;
use oci_spec::runtime::{LinuxDeviceCgroupBuilder, LinuxDeviceType};

fn cgroup2_mount() -> Option<std::path::PathBuf> {
    crishim_sys::mountinfo::read()
        .into_iter()
        .find(|m| m.fs_type == "cgroup2")
        .map(|m| m.mount_point)
}

/// In a child moved into `cgroup`: 0 if /dev/null opens and /dev/zero is refused with EPERM.
fn probe_in(cgroup: &std::path::Path) -> i32 {
    let procs = CString::new(
        cgroup
            .join("cgroup.procs")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    let (null, zero) = (c"/dev/null", c"/dev/zero");
    // SAFETY: between fork and _exit the child makes only raw system calls on memory prepared
    // before the fork (no allocation, no locks).
    unsafe {
        let child = libc::fork();
        assert!(child >= 0, "fork");
        if child == 0 {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                libc::_exit(10);
            }
            if libc::open(null.as_ptr(), libc::O_RDONLY) < 0 {
                libc::_exit(11);
            }
            let z = libc::open(zero.as_ptr(), libc::O_RDONLY);
            let refused = z < 0 && *libc::__errno_location() == libc::EPERM;
            libc::_exit(if refused { 0 } else { 12 });
        }
        let mut status = 0;
        libc::waitpid(child, &mut status, 0);
        if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            -1
        }
    }
}

/// What `Devices::apply_devices` does, less the rlimit bump.
fn attach_without_rlimit(
    dir: &std::path::Path,
    rules: &[LinuxDeviceCgroup],
) -> Result<(), DevicesControllerError> {
    use nix::fcntl::{open, OFlag};
    let mut emulator = Emulator::with_default_allow(false);
    emulator.add_rules(rules);
    let program = Program::from_rules(&emulator.rules, emulator.default_allow)?;
    let fd = prog::load("Apache", program.bytecodes())?;
    let cgroup = open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )?;
    let attached = prog::attach(fd, cgroup);
    // SAFETY: both descriptors are ours and used no more.
    unsafe {
        libc::close(cgroup);
        libc::close(fd);
    }
    Ok(attached?)
}

#[test]
fn the_v2_device_filter_refuses_devices_the_rules_do_not_allow() {
    let Some(root) = cgroup2_mount() else {
        eprintln!("skipped: no cgroup2 hierarchy mounted");
        return;
    };
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let dir = root.join(format!("crishim-devtest-{}", std::process::id()));
    std::fs::create_dir(&dir).expect("creating a cgroup2 directory");
    let rules = vec![
        LinuxDeviceCgroupBuilder::default()
            .allow(false)
            .access("rwm")
            .build()
            .unwrap(),
        LinuxDeviceCgroupBuilder::default()
            .allow(true)
            .typ(LinuxDeviceType::C)
            .major(1)
            .minor(3)
            .access("rwm")
            .build()
            .unwrap(),
    ];
    let applied = match Devices::apply_devices(&dir, &Some(rules.clone())) {
        // libcgroups first raises RLIMIT_MEMLOCK to 128 MiB, which root without CAP_SYS_RESOURCE
        // (a nested host like this one) may not do; kernels since 5.11 charge BPF programs to
        // the memory cgroup instead, so the program itself still loads. Check that program.
        Err(DevicesControllerError::Bpf(BpfError::FailedToIncreaseRLimit)) => {
            eprintln!("RLIMIT_MEMLOCK cannot be raised here: loading the program without it");
            attach_without_rlimit(&dir, &rules)
        }
        other => other,
    }
    .map(|_| probe_in(&dir));
    let _ = std::fs::remove_dir(&dir);
    // A sandbox that forbids bpf(2) altogether (EPERM even for root) cannot run the check; a
    // program the kernel's verifier rejects fails with another error and does fail the test.
    if let Err(DevicesControllerError::Bpf(BpfError::Errno(e))) = &applied {
        if e.0 == libc::EPERM {
            eprintln!("skipped: bpf(2) is not permitted here");
            return;
        }
    }
    assert_eq!(
        applied.expect("loading and attaching the eBPF device program"),
        0,
        "in the cgroup, /dev/null must open and /dev/zero be refused (10: not moved, 11: null \
         refused, 12: zero allowed)"
    );
}
