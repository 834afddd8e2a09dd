//! The spec as a whole: annotations, root, cgroups path, JSON.

use super::*;

#[test]
fn annotations_are_copied_with_containerds() {
    let mut f = Fixture::new();
    f.config.annotations = [("example.com/a".to_string(), "1".to_string())].into();
    let spec = f.spec();
    let a = spec.annotations().clone().unwrap();
    assert_eq!(a["example.com/a"], "1");
    assert_eq!(a[ANNOTATION_CONTAINER_TYPE], "container");
    assert_eq!(a[ANNOTATION_CONTAINER_NAME], "app");
    assert_eq!(a[ANNOTATION_IMAGE_NAME], "docker.io/library/busybox:1.36");
    assert_eq!(a[ANNOTATION_SANDBOX_NAME], "web");
    assert_eq!(a[ANNOTATION_SANDBOX_NAMESPACE], "default");
    assert!(!a.contains_key("io.kubernetes.cri.sandbox-id"));

    f.config.image.as_mut().unwrap().user_specified_image = "busybox".to_string();
    assert_eq!(
        f.spec().annotations().clone().unwrap()[ANNOTATION_IMAGE_NAME],
        "busybox"
    );
}

#[test]
fn root_and_cgroups_path_come_from_the_inputs() {
    let f = Fixture::new();
    let spec = f.spec();
    let root = spec.root().as_ref().unwrap();
    assert_eq!(root.path(), f.rootfs.path());
    assert_eq!(root.readonly(), Some(false));
    assert_eq!(
        linux(&spec).cgroups_path().as_deref(),
        Some(Path::new("/kubepods/besteffort/poduid-1/c1"))
    );
}

#[test]
fn spec_carries_no_library_defaults_and_round_trips_through_json() {
    let spec = Fixture::new().spec();
    let json = serde_json::to_value(&spec).unwrap();
    assert_eq!(json["ociVersion"], "1.1.0");
    assert!(json["process"]["apparmorProfile"].is_null());
    assert_eq!(json["process"]["user"]["uid"], 0);
    let back: Spec = serde_json::from_value(json).unwrap();
    assert_eq!(back, spec);
}

#[test]
fn passed_annotations_never_replace_crishims_and_the_sandbox_id_is_set_last() {
    let mut f = Fixture::new();
    f.config.annotations = [("example.com/a".to_string(), "config".to_string())].into();
    f.passed_annotations = [
        ("example.com/a", "passed"),
        ("example.com/b", "passed"),
        (ANNOTATION_CONTAINER_NAME, "passed"),
        (ANNOTATION_SANDBOX_ID, "passed"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let a = f.spec().annotations().clone().unwrap();
    assert_eq!(a["example.com/a"], "config");
    assert_eq!(a["example.com/b"], "passed");
    assert_eq!(a[ANNOTATION_CONTAINER_NAME], "app");
    // Nothing sets the sandbox id but the caller, who did not here.
    assert_eq!(a[ANNOTATION_SANDBOX_ID], "passed");
    f.sandbox_id = Some("pod-1".to_string());
    let a = f.spec().annotations().clone().unwrap();
    assert_eq!(a[ANNOTATION_SANDBOX_ID], "pod-1");
}
