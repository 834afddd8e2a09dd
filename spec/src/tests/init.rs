//! Running the program under crishim's init.

use super::*;

#[test]
fn init_wraps_the_args_and_is_bound_read_only_last() {
    let mut f = Fixture::new();
    f.config.command = strings(&["/bin/sh", "-c", "echo hi"]);
    f.init = Some("/usr/libexec/crishim/init".into());
    let spec = f.spec();
    assert_eq!(
        args(&spec),
        strings(&[INIT_PATH, "--", "/bin/sh", "-c", "echo hi"])
    );
    let init = mounts(&spec).last().unwrap();
    assert_eq!(init.destination(), Path::new(INIT_PATH));
    assert_eq!(init.typ().as_deref(), Some("bind"));
    assert_eq!(
        init.source().as_deref(),
        Some(Path::new("/usr/libexec/crishim/init"))
    );
    assert_eq!(options(init), strings(&["rbind", "ro", "nosuid", "nodev"]));
}

/// In a user namespace only the pod's binds are idmapped: init's is the node's.
#[test]
fn the_pod_binds_are_the_pods_own_and_not_inits() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.add_mount("/data", dir.path());
    let without_init = f.spec();
    f.init = Some("/usr/libexec/crishim/init".into());
    let built = f.built().unwrap();
    let shown = |b: &userns::PodBinds| format!("{b:?}");
    assert_eq!(
        shown(&built.pod_binds),
        shown(&userns::PodBinds::of(&without_init))
    );
    assert!(shown(&built.pod_binds).contains("/data"));
    assert_ne!(
        shown(&built.pod_binds),
        shown(&userns::PodBinds::of(&built.spec))
    );
}
