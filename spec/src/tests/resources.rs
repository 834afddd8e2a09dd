//! Resources: cgroup limits, the oom score and sysctls.

use super::*;

#[test]
fn pod_sysctls_are_copied() {
    let mut f = Fixture::new();
    assert_eq!(linux(&f.spec()).sysctl(), &None);
    f.sandbox.linux.get_or_insert_with(Default::default).sysctls = [(
        "net.ipv4.ip_unprivileged_port_start".to_string(),
        "0".to_string(),
    )]
    .into();
    let sysctl = linux(&f.spec()).sysctl().clone().unwrap();
    assert_eq!(sysctl["net.ipv4.ip_unprivileged_port_start"], "0");
}

#[test]
fn cpu_and_memory_limits_are_mapped_with_swap_equal_to_memory() {
    let mut f = Fixture::new();
    let r = f.resources();
    r.cpu_period = 100_000;
    r.cpu_quota = 50_000;
    r.cpu_shares = 512;
    r.cpuset_cpus = "0-1".to_string();
    r.cpuset_mems = "0".to_string();
    r.memory_limit_in_bytes = 256 << 20;
    let spec = f.spec();
    let cpu = resources(&spec).cpu().clone().unwrap();
    assert_eq!(
        (cpu.period(), cpu.quota(), cpu.shares()),
        (Some(100_000), Some(50_000), Some(512))
    );
    assert_eq!(
        (cpu.cpus().as_deref(), cpu.mems().as_deref()),
        (Some("0-1"), Some("0"))
    );
    let memory = resources(&spec).memory().unwrap();
    assert_eq!(
        (memory.limit(), memory.swap()),
        (Some(256 << 20), Some(256 << 20))
    );
}

#[test]
fn explicit_swap_limit_wins_and_no_swap_limit_without_swap_accounting() {
    let mut f = Fixture::new();
    f.resources().memory_limit_in_bytes = 256 << 20;
    f.resources().memory_swap_limit_in_bytes = 512 << 20;
    assert_eq!(
        resources(&f.spec()).memory().unwrap().swap(),
        Some(512 << 20)
    );
    f.host.swap_controller = false;
    let spec = f.spec();
    let memory = resources(&spec).memory().unwrap();
    assert_eq!((memory.limit(), memory.swap()), (Some(256 << 20), None));
}

#[test]
fn unset_resources_leave_only_device_rules() {
    let mut f = Fixture::new();
    f.resources();
    let spec = f.spec();
    let r = resources(&spec);
    assert_eq!(
        (r.cpu(), r.memory(), r.hugepage_limits(), r.unified()),
        (&None, &None, &None, &None)
    );
    assert!(r.devices().is_some());
}

#[test]
fn hugepage_limits_need_the_hugetlb_controller() {
    let mut f = Fixture::new();
    f.resources().hugepage_limits = vec![cri::HugepageLimit {
        page_size: "2MB".to_string(),
        limit: 4 << 20,
    }];
    let limits = resources(&f.spec()).hugepage_limits().clone().unwrap();
    assert_eq!(
        (limits[0].page_size().as_str(), limits[0].limit()),
        ("2MB", 4 << 20)
    );
    f.host.hugetlb_controller = false;
    assert_eq!(resources(&f.spec()).hugepage_limits(), &None);
}

#[test]
fn hugepage_limits_are_bounded_even_where_they_are_not_enforced() {
    let mut f = Fixture::new();
    f.host.hugetlb_controller = false;
    let limit = |page_size: &str| cri::HugepageLimit {
        page_size: page_size.to_string(),
        limit: 1,
    };
    f.resources().hugepage_limits = vec![limit("2MB"); 17];
    assert!(f.invalid().contains("at most 16"));
    f.resources().hugepage_limits = vec![limit(&"9".repeat(17))];
    assert!(f.invalid().contains("longer than 16"));
    f.resources().hugepage_limits = vec![limit("2MB"), limit("1GB")];
    f.spec();
}

#[test]
fn unified_map_is_copied() {
    let mut f = Fixture::new();
    f.resources().unified = [("memory.high".to_string(), "1G".to_string())].into();
    assert_eq!(
        resources(&f.spec()).unified().clone().unwrap()["memory.high"],
        "1G"
    );
}

#[test]
fn unified_keys_that_leave_the_cgroup_directory_are_invalid() {
    for key in [
        "../memory.max",
        "memory.max/../../cgroup.procs",
        "memory/../x.max",
        "memory..max",
        "memory.",
        ".max",
        "memorymax",
        "memory.max\0",
        "Memory.max",
        "",
    ] {
        let mut f = Fixture::new();
        f.resources().unified = [(key.to_string(), "1".to_string())].into();
        assert!(f.invalid().contains("unified"), "{key:?} accepted");
    }
    let mut f = Fixture::new();
    f.resources().unified = [
        ("hugetlb.2MB.max".to_string(), "0".to_string()),
        ("io.max".to_string(), "8:0 rbps=1".to_string()),
        ("memory.swap.max".to_string(), "0".to_string()),
    ]
    .into();
    assert_eq!(resources(&f.spec()).unified().as_ref().unwrap().len(), 3);
    f.resources().unified = [("memory.high".to_string(), "1\0".to_string())].into();
    assert!(f.invalid().contains("NUL"));
}

#[test]
fn negative_cpu_shares_are_invalid() {
    let mut f = Fixture::new();
    f.resources().cpu_shares = -2;
    assert!(f.invalid().contains("cpu_shares"));
}

#[test]
fn oom_score_adj_is_never_below_the_daemons() {
    let mut f = Fixture::new();
    assert_eq!(process(&f.spec()).oom_score_adj(), None);
    f.resources().oom_score_adj = -997;
    assert_eq!(process(&f.spec()).oom_score_adj(), Some(-997));
    f.min_oom_score_adj = Some(-500);
    assert_eq!(process(&f.spec()).oom_score_adj(), Some(-500));
    f.resources().oom_score_adj = 1000;
    assert_eq!(process(&f.spec()).oom_score_adj(), Some(1000));
    f.resources().oom_score_adj = 5000;
    assert_eq!(process(&f.spec()).oom_score_adj(), Some(1000));
}
