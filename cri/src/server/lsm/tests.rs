use super::*;

fn with_security(f: impl FnOnce(&mut cri::LinuxContainerSecurityContext)) -> cri::ContainerConfig {
    let mut sc = cri::LinuxContainerSecurityContext::default();
    f(&mut sc);
    cri::ContainerConfig {
        linux: Some(cri::LinuxContainerConfig {
            security_context: Some(sc),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
#[allow(deprecated)]
fn lsm_options_are_applied_or_refused_never_dropped() {
    use cri::security_profile::ProfileType;
    let none = Lsm {
        apparmor: false,
        selinux: false,
    };
    let apparmor = Lsm {
        apparmor: true,
        selinux: false,
    };
    let localhost = with_security(|sc| {
        sc.apparmor = Some(cri::SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: "my-profile".into(),
        })
    });
    let e = check_lsm_options(&localhost, none).unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("localhost/my-profile"), "{e:?}");
    assert_eq!(
        check_lsm_options(&localhost, apparmor).unwrap(),
        Some("my-profile".to_string())
    );
    // The deprecated string field says the same.
    let old = with_security(|sc| sc.apparmor_profile = "localhost/other".into());
    assert_eq!(
        check_lsm_options(&old, none).unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(
        check_lsm_options(&old, apparmor).unwrap(),
        Some("other".to_string())
    );
    // RuntimeDefault and unconfined need nothing where there is no AppArmor.
    let default = with_security(|sc| {
        sc.apparmor = Some(cri::SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            ..Default::default()
        })
    });
    assert_eq!(check_lsm_options(&default, none).unwrap(), None);
    let unconfined = with_security(|sc| sc.apparmor_profile = "unconfined".into());
    assert_eq!(check_lsm_options(&unconfined, none).unwrap(), None);
    // Where AppArmor is on: RuntimeDefault, and nothing asked, get crishim-default;
    // Unconfined and privileged containers get none.
    let ours = Some(crishim_spec::apparmor::DEFAULT_PROFILE.to_string());
    assert_eq!(check_lsm_options(&default, apparmor).unwrap(), ours);
    assert_eq!(
        check_lsm_options(&with_security(|_| {}), apparmor).unwrap(),
        ours
    );
    assert_eq!(check_lsm_options(&unconfined, apparmor).unwrap(), None);
    let privileged = with_security(|sc| sc.privileged = true);
    assert_eq!(check_lsm_options(&privileged, apparmor).unwrap(), None);
    // A name that is not one.
    let bad = with_security(|sc| sc.apparmor_profile = "localhost/".into());
    assert_eq!(
        check_lsm_options(&bad, apparmor).unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    // An attacker-sized name is refused, and not echoed whole.
    let huge =
        with_security(|sc| sc.apparmor_profile = format!("localhost/{}", "p".repeat(1 << 20)));
    let e = check_lsm_options(&huge, apparmor).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().len() < 512, "{} bytes", e.message().len());
    // An SELinux label is refused with SELinux off, taken with it on (its fields checked);
    // an empty one is none.
    let label = with_security(|sc| {
        sc.selinux_options = Some(cri::SeLinuxOption {
            r#type: "container_t".into(),
            ..Default::default()
        })
    });
    let selinux = Lsm {
        apparmor: false,
        selinux: true,
    };
    let e = check_lsm_options(&label, none).unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert_eq!(check_lsm_options(&label, selinux).unwrap(), None);
    let bad = with_security(|sc| {
        sc.selinux_options = Some(cri::SeLinuxOption {
            r#type: "container_t:s0".into(),
            ..Default::default()
        })
    });
    let e = check_lsm_options(&bad, selinux).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let empty = with_security(|sc| sc.selinux_options = Some(cri::SeLinuxOption::default()));
    assert_eq!(check_lsm_options(&empty, none).unwrap(), None);
}

// No SELinux here: the decision is taken with a host that has it, and one that has not.
#[test]
fn selinux_labels_are_the_pods_own_level_and_none_when_privileged_or_off() {
    let pod = super::super::fakes::pod_record("pod-1");
    let plain = cri::ContainerConfig::default();
    let on = Lsm {
        apparmor: false,
        selinux: true,
    };
    let l = selinux_labels(&pod, &plain, on).unwrap();
    let level = crishim_spec::selinux::pod_level("pod-1");
    assert_eq!(l.process, format!("system_u:system_r:container_t:{level}"));
    assert_eq!(
        l.file,
        format!("system_u:object_r:container_file_t:{level}")
    );
    let privileged = with_security(|sc| sc.privileged = true);
    assert_eq!(selinux_labels(&pod, &privileged, on), None);
    let off = Lsm {
        apparmor: false,
        selinux: false,
    };
    assert_eq!(selinux_labels(&pod, &plain, off), None);
}
