use super::*;

const LABEL: &str = "system_u:system_r:container_t:s0:c1,c2";

// No SELinux on this kernel: a regular file stands in for /proc/thread-self/attr/exec, as a
// volume mounted over /proc would hold one. It must be refused and stay empty. (The old
// writer opened whatever path it was given and wrote the label there.)
#[test]
fn a_label_file_off_procfs_is_refused_and_left_unwritten() {
    let dir = tempfile::tempdir().unwrap();
    let attr = dir.path().join("exec");
    std::fs::write(&attr, "").unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&attr).unwrap();
    let e = ExecAttr::on_procfs(file).err().unwrap();
    assert!(e.contains("is not on procfs"), "{e}");
    assert_eq!(std::fs::read_to_string(&attr).unwrap(), "");
}

// Through the real handle the write reaches this thread's procfs attribute; this kernel has
// no LSM taking process labels (and the label is no context), so the kernel itself refuses
// it: the error is the write's, not the open's or the procfs check's.
#[test]
fn the_label_reaches_procfs_through_the_handle() {
    let e = set_exec_label("crishim-test-not-a-context").unwrap_err();
    assert!(e.contains("writing it"), "{e}");
    assert!(
        !e.contains("not on procfs") && !e.contains("opening"),
        "{e}"
    );
}

#[test]
fn a_directory_standing_in_for_proc_is_refused() {
    check_proc_root(std::path::Path::new("/proc")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let e = check_proc_root(dir.path()).unwrap_err();
    assert!(e.contains("is not the root of a procfs"), "{e}");
    // procfs, but not its root: no handle from it either.
    let e = check_proc_root(std::path::Path::new("/proc/self")).unwrap_err();
    assert!(e.contains("is not the root of a procfs"), "{e}");
}

const CHILD: &str = "CRISHIM_LSM_ATTR_CHILD";
const SCENARIO: &str = "lsm_attr::tests::a_volume_over_proc_does_not_take_the_label";

// runc's CVE-2019-16884: a volume over /proc, or over this thread's attr directory, holding
// a regular file attr/exec. Played in a child process of its own (a mount namespace, tmpfs
// mounts, a capability dropped), so no other test, and no cached procfs handle, is in the
// way. The old plain open of /proc/thread-self/attr/exec wrote the label into both.
#[test]
fn a_volume_over_proc_does_not_take_the_label() {
    if std::env::var_os(CHILD).is_some() {
        return over_proc();
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: a mount namespace and tmpfs mounts in /proc need root");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([SCENARIO, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

fn over_proc() {
    use caps::{CapSet, Capability::CAP_SYS_ADMIN};
    use nix::mount::{mount, MsFlags};
    let none = None::<&str>;
    let tmpfs = |at: &str| {
        mount(
            Some("crishim-test"),
            at,
            Some("tmpfs"),
            MsFlags::empty(),
            none,
        )
        .unwrap();
        let stand_in = std::path::Path::new("/proc/thread-self/attr/exec");
        std::fs::create_dir_all(stand_in.parent().unwrap()).unwrap();
        std::fs::write(stand_in, "").unwrap();
        // What a plain open of the attribute now finds: the volume's regular file.
        assert_eq!(
            nix::sys::statfs::statfs(stand_in)
                .unwrap()
                .filesystem_type(),
            nix::sys::statfs::TMPFS_MAGIC
        );
        stand_in
    };
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("a mount namespace");
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none).unwrap();

    // A volume over this thread's attr directory, in a real /proc. Without CAP_SYS_ADMIN (a
    // container's init, usually) the handle is that /proc, and the lookup may not cross
    // into the volume: refused.
    let stand_in = tmpfs("/proc/thread-self/attr");
    caps::drop(None, CapSet::Effective, CAP_SYS_ADMIN).unwrap();
    let e = set_exec_label(LABEL).unwrap_err();
    assert!(e.contains("opening /proc/thread-self/attr/exec"), "{e}");
    assert_eq!(std::fs::read_to_string(stand_in).unwrap(), "");
    // With it, the handle is a procfs of its own, beneath no volume: the write reaches the
    // real attribute (refused by this kernel, which has no SELinux), never the stand-in.
    caps::raise(None, CapSet::Effective, CAP_SYS_ADMIN).unwrap();
    let e = set_exec_label(LABEL).unwrap_err();
    assert!(e.contains("writing it"), "{e}");
    assert_eq!(std::fs::read_to_string(stand_in).unwrap(), "");

    // A volume over /proc itself: refused, with or without the capability.
    let stand_in = tmpfs("/proc");
    let e = set_exec_label(LABEL).unwrap_err();
    assert!(e.contains("/proc is not the root of a procfs"), "{e}");
    caps::drop(None, CapSet::Effective, CAP_SYS_ADMIN).unwrap();
    let e = set_exec_label(LABEL).unwrap_err();
    assert!(e.contains("/proc is not the root of a procfs"), "{e}");
    assert_eq!(std::fs::read_to_string(stand_in).unwrap(), "");
}
