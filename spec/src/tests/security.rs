//! The security context: capabilities, privileged, no_new_privs, masked and read-only paths.

use super::*;
use crate::security::{DEFAULT_CAPS, DEFAULT_MASKED_PATHS, DEFAULT_READONLY_PATHS};

#[test]
fn default_capabilities_are_containerds_in_bounding_effective_permitted_only() {
    let spec = Fixture::new().spec();
    let caps = process(&spec).capabilities().clone().unwrap();
    let expected: HashSet<_> = DEFAULT_CAPS.into_iter().collect();
    assert_eq!(caps.bounding().as_ref(), Some(&expected));
    assert_eq!(caps.effective().as_ref(), Some(&expected));
    assert_eq!(caps.permitted().as_ref(), Some(&expected));
    assert_eq!(caps.inheritable(), &None);
    assert_eq!(caps.ambient(), &None);
}

#[test]
fn capabilities_are_added_and_dropped_with_or_without_prefix() {
    let mut f = Fixture::new();
    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: strings(&["NET_ADMIN", "CAP_SYS_TIME", "sys_ptrace"]),
        drop_capabilities: strings(&["MKNOD", "cap_net_raw"]),
        ..Default::default()
    });
    let caps = bounding(&f.spec());
    for cap in [
        Capability::NetAdmin,
        Capability::SysTime,
        Capability::SysPtrace,
        Capability::Chown,
    ] {
        assert!(caps.contains(&cap), "{cap:?}");
    }
    assert!(!caps.contains(&Capability::Mknod));
    assert!(!caps.contains(&Capability::NetRaw));
    assert_eq!(caps.len(), 14 + 3 - 2);
}

#[test]
fn all_is_every_capability_the_daemon_has_and_drop_all_keeps_only_added_ones() {
    let mut f = Fixture::new();
    f.host.current_caps = caps_from_mask(0x1f_feff_ffff); // everything but CAP_SYS_RESOURCE
    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: strings(&["ALL"]),
        drop_capabilities: strings(&["CHOWN"]),
        ..Default::default()
    });
    let caps = bounding(&f.spec());
    assert!(caps.contains(&Capability::SysAdmin));
    assert!(!caps.contains(&Capability::SysResource));
    assert!(!caps.contains(&Capability::Chown));

    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: strings(&["NET_BIND_SERVICE"]),
        drop_capabilities: strings(&["ALL"]),
        ..Default::default()
    });
    assert_eq!(
        bounding(&f.spec()),
        HashSet::from([Capability::NetBindService])
    );
}

#[test]
fn unknown_capability_is_invalid() {
    let mut f = Fixture::new();
    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: strings(&["FLY"]),
        ..Default::default()
    });
    assert!(f.invalid().contains("\"FLY\""));
}

#[test]
fn capability_bits_map_to_names() {
    assert_eq!(
        caps_from_mask(1 << 21),
        HashSet::from([Capability::SysAdmin])
    );
    assert_eq!(
        caps_from_mask(1 | 1 << 40),
        HashSet::from([Capability::Chown, Capability::CheckpointRestore])
    );
    assert_eq!(caps_from_mask(u64::MAX).len(), 41);
}

#[test]
fn privileged_container_needs_a_privileged_pod() {
    let mut f = Fixture::new();
    f.sc().privileged = true;
    assert!(f.invalid().contains("privileged"));
}

#[test]
fn privileged_gets_all_caps_writable_sys_no_masks_and_no_seccomp() {
    let mut f = Fixture::new();
    f.privileged_pod();
    f.sc().privileged = true;
    f.sc().seccomp = Some(cri::SecurityProfile::default()); // RuntimeDefault, ignored
    f.sc().capabilities = Some(cri::Capability {
        drop_capabilities: strings(&["ALL"]),
        ..Default::default()
    });
    let spec = f.spec();
    assert_eq!(bounding(&spec), caps_from_mask(u64::MAX));
    assert_eq!(linux(&spec).masked_paths().as_deref(), Some(&[][..]));
    assert_eq!(linux(&spec).readonly_paths().as_deref(), Some(&[][..]));
    assert_eq!(options(mount_at(&spec, "/sys")).last().unwrap(), "rw");
    assert_eq!(
        options(mount_at(&spec, "/sys/fs/cgroup")).last().unwrap(),
        "rw"
    );
    assert_eq!(linux(&spec).seccomp(), &None);
}

#[test]
fn no_new_privs_follows_the_security_context() {
    let mut f = Fixture::new();
    // Absent, not `false`: libcontainer loads seccomp early (privileged) only then.
    assert_eq!(process(&f.spec()).no_new_privileges(), None);
    f.sc().no_new_privs = true;
    assert_eq!(process(&f.spec()).no_new_privileges(), Some(true));
}

#[test]
fn masked_and_readonly_paths_default_to_containerds_when_not_given() {
    let mut f = Fixture::new();
    let spec = f.spec();
    assert_eq!(
        linux(&spec).masked_paths().clone().unwrap(),
        strings(&DEFAULT_MASKED_PATHS)
    );
    assert_eq!(
        linux(&spec).readonly_paths().clone().unwrap(),
        strings(&DEFAULT_READONLY_PATHS)
    );
    f.sc().masked_paths = strings(&["/proc/kcore"]);
    f.sc().readonly_paths = strings(&["/proc/sys"]);
    let spec = f.spec();
    assert_eq!(
        linux(&spec).masked_paths().clone().unwrap(),
        strings(&["/proc/kcore"])
    );
    assert_eq!(
        linux(&spec).readonly_paths().clone().unwrap(),
        strings(&["/proc/sys"])
    );
}
