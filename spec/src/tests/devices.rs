//! Device nodes and the device cgroup rules.

use super::*;
use oci_spec::runtime::LinuxDeviceType;

#[test]
fn device_cgroup_denies_all_then_allows_the_standard_devices() {
    let spec = Fixture::new().spec();
    let rules = resources(&spec).devices().clone().unwrap();
    assert!(!rules[0].allow());
    assert_eq!(rules[0].typ(), None);
    assert_eq!(rules[0].access().as_deref(), Some("rwm"));
    let allowed: Vec<_> = rules[1..]
        .iter()
        .map(|r| {
            assert!(r.allow());
            assert_eq!(r.typ(), Some(LinuxDeviceType::C));
            (r.major().unwrap(), r.minor())
        })
        .collect();
    for dev in [
        (1, Some(3)),
        (1, Some(5)),
        (1, Some(7)),
        (1, Some(8)),
        (1, Some(9)),
        (5, Some(0)),
        (5, Some(2)),
        (136, None),
    ] {
        assert!(allowed.contains(&dev), "{dev:?} not allowed");
    }
    assert_eq!(linux(&spec).devices().as_deref(), Some(&[][..]));
}

#[test]
fn cri_device_becomes_a_node_and_an_allow_rule() {
    let mut f = Fixture::new();
    f.config.devices.push(cri::Device {
        container_path: "/dev/mynull".to_string(),
        host_path: "/dev/null".to_string(),
        permissions: "rw".to_string(),
    });
    let spec = f.spec();
    let nodes = linux(&spec).devices().clone().unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].path(), Path::new("/dev/mynull"));
    assert_eq!(
        (nodes[0].typ(), nodes[0].major(), nodes[0].minor()),
        (LinuxDeviceType::C, 1, 3)
    );
    let rule = resources(&spec).devices().clone().unwrap().pop().unwrap();
    assert!(rule.allow());
    assert_eq!(
        (rule.typ(), rule.major(), rule.minor()),
        (Some(LinuxDeviceType::C), Some(1), Some(3))
    );
    assert_eq!(rule.access().as_deref(), Some("rw"));
}

#[test]
fn missing_or_non_device_host_path_is_invalid() {
    let mut f = Fixture::new();
    f.config.devices.push(cri::Device {
        container_path: "/dev/x".to_string(),
        host_path: "/dev/crishim-missing".to_string(),
        permissions: "rwm".to_string(),
    });
    assert!(f.invalid().contains("/dev/crishim-missing"));
    let file = f.rootfs.path().join("etc/passwd");
    f.config.devices[0].host_path = file.display().to_string();
    assert!(f.invalid().contains("is not a device"));
}

#[test]
fn privileged_gets_all_host_devices_and_all_access() {
    let mut f = Fixture::new();
    f.privileged_pod();
    f.sc().privileged = true;
    let spec = f.spec();
    let rules = resources(&spec).devices().clone().unwrap();
    assert_eq!(rules.len(), 1);
    assert!(rules[0].allow());
    assert_eq!((rules[0].typ(), rules[0].major()), (None, None));
    let nodes = linux(&spec).devices().clone().unwrap();
    let null = nodes
        .iter()
        .find(|n| n.path() == Path::new("/dev/null"))
        .expect("/dev/null listed");
    assert_eq!(
        (null.typ(), null.major(), null.minor()),
        (LinuxDeviceType::C, 1, 3)
    );
    assert!(nodes.iter().all(|n| !n.path().starts_with("/dev/pts")));
}

#[test]
fn privileged_without_host_devices_keeps_the_default_rules_and_no_host_nodes() {
    let mut f = Fixture::new();
    f.privileged_pod();
    f.sc().privileged = true;
    f.privileged_host_devices = false;
    let spec = f.spec();
    let rules = resources(&spec).devices().clone().unwrap();
    assert!(!rules[0].allow(), "deny all first");
    assert!(rules.len() > 1);
    let nodes = linux(&spec).devices().clone().unwrap_or_default();
    assert!(nodes.is_empty(), "{nodes:?}");
    // Still privileged in every other way.
    let caps = process(&spec).capabilities().clone().unwrap();
    assert!(caps.effective().as_ref().unwrap().len() > 30);
}
