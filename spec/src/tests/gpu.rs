//! A GPU plan's edits: made after init's, CDI's first, then the rest in order.

use crishim_gpu::discover::Node;
use crishim_gpu::inject::Edit;
use oci_spec::runtime::LinuxDeviceType;

use super::*;

const CDI_SPEC: &str = r#"cdiVersion: "0.6.0"
kind: "crishim.test/gpu"
devices:
  - name: "gpu0"
    containerEdits:
      env:
        - "PATH=/cdi/bin"
      deviceNodes:
        - path: "/dev/nvidia0"
          type: "c"
          major: 195
          minor: 0
"#;

#[test]
fn a_gpu_plans_edits_are_made_in_order_after_inits() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "gpu.yaml", CDI_SPEC);
    let cdi = crishim_gpu::cdi::resolve(
        &[dir.path().to_path_buf()],
        &["crishim.test/gpu=gpu0".to_string()],
    )
    .unwrap();
    let mut f = Fixture::new();
    f.init = Some("/usr/libexec/crishim/init".into());
    f.gpu = Some(crishim_gpu::Plan {
        cdi: Some(cdi),
        edits: vec![
            Edit::Device(Node {
                host: "/dev/nvidiactl".into(),
                container: "/dev/nvidiactl".into(),
                major: 195,
                minor: 255,
                mode: 0o666,
            }),
            Edit::bind(
                Path::new("/var/lib/crishim/gpu/lib64"),
                "/usr/local/nvidia/lib64",
                false,
            ),
            // Over init's bind: made after it, the GPU's edit wins.
            Edit::bind(Path::new("/gpu/init"), INIT_PATH, false),
            Edit::env("NVIDIA_VISIBLE_DEVICES", "GPU-1"),
            Edit::AppendPath("/usr/local/nvidia/bin".to_string()),
        ],
        grant: None,
    });
    let spec = f.spec();
    // CDI's env first, then the plan's, `PATH` extended as CDI left it.
    let env = env(&spec);
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=GPU-1".to_string()));
    assert!(
        env.contains(&"PATH=/cdi/bin:/usr/local/nvidia/bin".to_string()),
        "{env:?}"
    );
    assert_eq!(env.iter().filter(|e| e.starts_with("PATH=")).count(), 1);
    // The devices in order, each allowed.
    let nodes: Vec<_> = linux(&spec)
        .devices()
        .clone()
        .unwrap()
        .iter()
        .map(|d| (d.path().display().to_string(), d.typ(), d.minor()))
        .collect();
    assert_eq!(
        nodes,
        [
            ("/dev/nvidia0".to_string(), LinuxDeviceType::C, 0),
            ("/dev/nvidiactl".to_string(), LinuxDeviceType::C, 255),
        ]
    );
    let rules = resources(&spec).devices().clone().unwrap();
    assert!(rules
        .iter()
        .any(|r| r.allow() && r.major() == Some(195) && r.minor() == Some(255)));
    // The binds after init's, which the one at its destination replaced; the args still init's.
    let dests = destinations(&spec);
    assert_eq!(
        &dests[dests.len() - 2..],
        ["/usr/local/nvidia/lib64", INIT_PATH]
    );
    assert_eq!(
        mount_at(&spec, INIT_PATH).source().as_deref(),
        Some(Path::new("/gpu/init"))
    );
    assert_eq!(args(&spec), strings(&[INIT_PATH, "--", "sh"]));
}

#[test]
fn an_empty_gpu_plan_changes_nothing() {
    let mut f = Fixture::new();
    let before = f.spec();
    f.gpu = Some(crishim_gpu::Plan::default());
    assert_eq!(f.spec(), before);
}
