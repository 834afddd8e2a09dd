//! The AppArmor profile and the SELinux labels the daemon decides on.

use super::*;

#[test]
fn the_apparmor_profile_given_is_the_processs() {
    let mut f = Fixture::new();
    assert_eq!(process(&f.spec()).apparmor_profile(), &None);
    f.apparmor_profile = Some(crate::apparmor::DEFAULT_PROFILE.to_string());
    assert_eq!(
        process(&f.spec()).apparmor_profile().as_deref(),
        Some(crate::apparmor::DEFAULT_PROFILE)
    );
}

#[test]
fn selinux_labels_go_to_the_process_and_the_mount_label() {
    let mut f = Fixture::new();
    let spec = f.spec();
    assert_eq!(
        (process(&spec).selinux_label(), linux(&spec).mount_label()),
        (&None, &None)
    );
    f.selinux = Some(selinux::Labels {
        process: "system_u:system_r:container_t:s0:c1,c2".to_string(),
        file: "system_u:object_r:container_file_t:s0:c1,c2".to_string(),
    });
    let spec = f.spec();
    assert_eq!(
        process(&spec).selinux_label().as_deref(),
        Some("system_u:system_r:container_t:s0:c1,c2")
    );
    assert_eq!(
        linux(&spec).mount_label().as_deref(),
        Some("system_u:object_r:container_file_t:s0:c1,c2")
    );
}
