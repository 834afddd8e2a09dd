//! Seccomp: none, a localhost profile, or RuntimeDefault.

use super::*;
use oci_spec::runtime::{LinuxSeccompAction, LinuxSeccompOperator};

#[test]
fn seccomp_is_unset_by_default_and_when_unconfined() {
    let mut f = Fixture::new();
    assert_eq!(linux(&f.spec()).seccomp(), &None);
    f.sc().seccomp = Some(cri::SecurityProfile {
        profile_type: cri::security_profile::ProfileType::Unconfined as i32,
        localhost_ref: String::new(),
    });
    assert_eq!(linux(&f.spec()).seccomp(), &None);
}

fn localhost(path: &Path) -> Option<cri::SecurityProfile> {
    Some(cri::SecurityProfile {
        profile_type: cri::security_profile::ProfileType::Localhost as i32,
        localhost_ref: path.display().to_string(),
    })
}

#[test]
fn localhost_seccomp_profile_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "profile.json",
        r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","write"],"action":"SCMP_ACT_ALLOW"}]}"#,
    );
    let mut f = Fixture::new();
    f.sc().seccomp = localhost(&dir.path().join("profile.json"));
    let seccomp = linux(&f.spec()).seccomp().clone().unwrap();
    assert_eq!(seccomp.default_action(), LinuxSeccompAction::ScmpActErrno);
    assert_eq!(
        seccomp.syscalls().as_ref().unwrap()[0].names(),
        &strings(&["read", "write"])
    );
}

#[test]
fn deprecated_localhost_profile_path_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "p.json", r#"{"defaultAction":"SCMP_ACT_LOG"}"#);
    let mut f = Fixture::new();
    #[allow(deprecated)]
    {
        f.sc().seccomp_profile_path = format!("localhost/{}", dir.path().join("p.json").display());
    }
    assert_eq!(
        linux(&f.spec()).seccomp().clone().unwrap().default_action(),
        LinuxSeccompAction::ScmpActLog
    );
}

#[test]
fn missing_invalid_or_relative_localhost_profile_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "bad.json", "{ not json");
    let mut f = Fixture::new();
    f.sc().seccomp = localhost(&dir.path().join("missing.json"));
    assert!(f.invalid().contains("missing.json"));
    f.sc().seccomp = localhost(&dir.path().join("bad.json"));
    assert!(f.invalid().contains("bad.json"));
    f.sc().seccomp = localhost(Path::new("profiles/p.json"));
    assert!(f.invalid().contains("not absolute"));
    // A device, a FIFO or a huge file named as the profile is refused unread, at once.
    f.sc().seccomp = localhost(Path::new("/dev/zero"));
    assert!(f.invalid().contains("not a regular file"));
    let fifo = dir.path().join("fifo.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    f.sc().seccomp = localhost(&fifo);
    assert!(f.invalid().contains("not a regular file"));
    let huge = dir.path().join("huge.json");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    f.sc().seccomp = localhost(&huge);
    assert!(f.invalid().contains("larger than"));
}

#[test]
fn runtime_default_seccomp_is_containerds_profile() {
    let mut f = Fixture::new();
    f.sc().seccomp = Some(cri::SecurityProfile::default());
    let seccomp = linux(&f.spec()).seccomp().clone().unwrap();
    assert_eq!(seccomp.default_action(), LinuxSeccompAction::ScmpActErrno);
    assert!(
        !seccomp
            .architectures()
            .clone()
            .unwrap_or_default()
            .is_empty()
            || !cfg!(target_arch = "x86_64")
    );
    let rules = seccomp.syscalls().clone().unwrap();
    let allowed = |name: &str| {
        rules.iter().any(|r| {
            r.action() == LinuxSeccompAction::ScmpActAllow
                && r.args().is_none()
                && r.names().iter().any(|n| n == name)
        })
    };
    for name in ["read", "write", "openat2", "execve", "chroot"] {
        assert!(allowed(name), "{name} should be allowed");
    }
    // No CAP_SYS_ADMIN: no mount, no unshare, clone only without namespace flags, clone3 ENOSYS.
    assert!(!allowed("mount") && !allowed("unshare") && !allowed("clone"));
    let clone = rules
        .iter()
        .find(|r| r.names() == &strings(&["clone"]))
        .unwrap();
    let arg = clone.args().clone().unwrap()[0];
    assert_eq!(arg.op(), LinuxSeccompOperator::ScmpCmpMaskedEq);
    // The OCI order, as runc and containerd's profile read it: value is the mask, valueTwo the
    // datum (containerd's rule: value 2114060288).
    assert_eq!((arg.value(), arg.value_two()), (0x7e02_0000, Some(0)));
    let json = serde_json::to_value(arg).unwrap();
    assert_eq!(
        (&json["value"], &json["valueTwo"]),
        (&serde_json::json!(2_114_060_288u64), &serde_json::json!(0))
    );
    let clone3 = rules
        .iter()
        .find(|r| r.names() == &strings(&["clone3"]))
        .unwrap();
    assert_eq!(
        (clone3.action(), clone3.errno_ret()),
        (LinuxSeccompAction::ScmpActErrno, Some(libc::ENOSYS as u32))
    );
    // socket: every family but AF_ALG and AF_VSOCK.
    assert_eq!(
        rules
            .iter()
            .filter(|r| r.names() == &strings(&["socket"]))
            .count(),
        3
    );
}

#[test]
fn runtime_default_seccomp_widens_with_capabilities() {
    let mut f = Fixture::new();
    f.sc().seccomp = Some(cri::SecurityProfile::default());
    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: strings(&["SYS_ADMIN"]),
        ..Default::default()
    });
    let rules = linux(&f.spec())
        .seccomp()
        .clone()
        .unwrap()
        .syscalls()
        .clone()
        .unwrap();
    let unconditional = |name: &str| {
        rules
            .iter()
            .any(|r| r.args().is_none() && r.names().iter().any(|n| n == name))
    };
    assert!(unconditional("mount") && unconditional("clone") && unconditional("clone3"));
    assert!(!rules
        .iter()
        .any(|r| r.action() == LinuxSeccompAction::ScmpActErrno));
}

#[test]
fn seccomp_localhost_ref_with_another_type_is_invalid() {
    let mut f = Fixture::new();
    f.sc().seccomp = Some(cri::SecurityProfile {
        profile_type: 0,
        localhost_ref: "/p.json".to_string(),
    });
    assert!(f.invalid().contains("localhost_ref"));
}
