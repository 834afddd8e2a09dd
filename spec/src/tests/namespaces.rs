//! Namespaces and the hostname.

use super::*;

#[test]
fn pod_namespaces_are_joined_with_a_new_mount_and_pid_namespace() {
    let spec = Fixture::new().spec();
    assert_eq!(
        namespaces(&spec),
        vec![
            (LinuxNamespaceType::Pid, None),
            (LinuxNamespaceType::Ipc, Some("/proc/100/ns/ipc".into())),
            (LinuxNamespaceType::Uts, Some("/proc/100/ns/uts".into())),
            (LinuxNamespaceType::Mount, None),
            (LinuxNamespaceType::Network, Some("/proc/100/ns/net".into())),
        ]
    );
    assert_eq!(spec.hostname().as_deref(), Some("web-0"));
}

#[test]
fn host_namespaces_have_no_entry_and_keep_the_host_hostname() {
    let mut f = Fixture::new();
    f.namespaces = PodNamespaces {
        host_pid: true,
        ..Default::default()
    };
    let spec = f.spec();
    assert_eq!(namespaces(&spec), vec![(LinuxNamespaceType::Mount, None)]);
    assert_eq!(spec.hostname(), &None);
}

#[test]
fn pod_pid_namespace_is_joined() {
    let mut f = Fixture::new();
    f.namespaces.pid = Some("/proc/100/ns/pid".into());
    assert_eq!(
        namespaces(&f.spec())[0],
        (LinuxNamespaceType::Pid, Some("/proc/100/ns/pid".into()))
    );
}

#[test]
fn cgroup_namespace_only_on_cgroup_v2_and_not_when_privileged() {
    let mut f = Fixture::new();
    let has_cgroup_ns =
        |spec: &Spec| namespaces(spec).contains(&(LinuxNamespaceType::Cgroup, None));
    assert!(!has_cgroup_ns(&f.spec()));
    f.host.cgroup_v2 = true;
    assert!(has_cgroup_ns(&f.spec()));
    f.privileged_pod();
    f.sc().privileged = true;
    assert!(!has_cgroup_ns(&f.spec()));
}
