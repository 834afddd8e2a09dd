//! Tests of the spec builder, one file per concern. Each builds a spec from a small pod with
//! a temporary rootfs and node facts pinned by `Fixture`, changes one input and checks the
//! outcome the test is named after. The fixture and the helpers that read a spec are here.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use oci_spec::image::{Config as ImageConfig, ImageConfiguration};
use oci_spec::runtime::{Capability, LinuxNamespaceType, Mount, Spec};

use super::caps::caps_from_mask;
use super::host::HostFacts;
use super::*;

mod devices;
mod gpu;
mod host_facts;
mod init;
mod lsm;
mod mounts;
mod namespaces;
mod process;
mod resources;
mod seccomp;
mod security;
mod spec;
mod user;

const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1::/:/sbin/nologin
# a comment line
app:x:1000:1000::/home/app:/bin/sh
other:x:1001:1001::/home/other:/bin/sh
";

const GROUP: &str = "\
root:x:0:
daemon:x:1:
wheel:x:10:root,app
audio:x:29:app
video:x:44:app,other
staff:x:50:root
app:x:1000:app
other:x:1001:
";

struct Fixture {
    config: cri::ContainerConfig,
    sandbox: cri::PodSandboxConfig,
    image: ImageConfig,
    rootfs: tempfile::TempDir,
    namespaces: PodNamespaces,
    files: PodFiles,
    cgroups_path: String,
    min_oom_score_adj: Option<i32>,
    privileged_host_devices: bool,
    apparmor_profile: Option<String>,
    selinux: Option<selinux::Labels>,
    init: Option<PathBuf>,
    init_binary: Option<PathBuf>,
    gpu: Option<crishim_gpu::Plan>,
    passed_annotations: HashMap<String, String>,
    sandbox_id: Option<String>,
    host: HostFacts,
}

impl Fixture {
    /// Container "app" of pod "web" (hostname "web-0", in its own namespaces), image with
    /// `Cmd ["sh"]`, a rootfs holding PASSWD and GROUP, on a cgroup v1 node with swap and hugetlb
    /// accounting whose daemon has every capability.
    fn new() -> Self {
        let rootfs = tempfile::tempdir().unwrap();
        write(rootfs.path(), "etc/passwd", PASSWD);
        write(rootfs.path(), "etc/group", GROUP);
        let mut image = ImageConfig::default();
        image.set_cmd(Some(vec!["sh".to_string()]));
        Fixture {
            config: cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "app".to_string(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: "docker.io/library/busybox:1.36".to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            sandbox: cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: "web".to_string(),
                    uid: "uid-1".to_string(),
                    namespace: "default".to_string(),
                    attempt: 0,
                }),
                hostname: "web-0".to_string(),
                ..Default::default()
            },
            image,
            rootfs,
            namespaces: PodNamespaces {
                net: Some("/proc/100/ns/net".into()),
                ipc: Some("/proc/100/ns/ipc".into()),
                uts: Some("/proc/100/ns/uts".into()),
                pid: None,
                host_pid: false,
                user: None,
            },
            files: PodFiles::default(),
            cgroups_path: "/kubepods/besteffort/poduid-1/c1".to_string(),
            min_oom_score_adj: None,
            privileged_host_devices: true,
            apparmor_profile: None,
            selinux: None,
            init: None,
            init_binary: None,
            gpu: None,
            passed_annotations: HashMap::new(),
            sandbox_id: None,
            host: HostFacts {
                cgroup_v2: false,
                swap_controller: true,
                hugetlb_controller: true,
                current_caps: caps_from_mask(u64::MAX),
                hostname: "node-1".to_string(),
                dev_root: PathBuf::from("/dev"),
                nofile_hard: None,
                cgroup_v1_dirs: vec![
                    ("cpu,cpuacct".into(), vec!["cpu".into(), "cpuacct".into()]),
                    ("memory".into(), vec![]),
                ],
            },
        }
    }

    fn build(&self) -> Result<Spec, SpecError> {
        self.built().map(|b| b.spec)
    }

    fn built(&self) -> Result<Built, SpecError> {
        let mut image = ImageConfiguration::default();
        image.set_config(Some(self.image.clone()));
        let inputs = SpecInputs {
            image_volumes: &[],
            container_id: "c1",
            config: &self.config,
            sandbox: &self.sandbox,
            image: &image,
            rootfs: self.rootfs.path().to_path_buf(),
            namespaces: self.namespaces.clone(),
            files: self.files.clone(),
            cgroups_path: self.cgroups_path.clone(),
            min_oom_score_adj: self.min_oom_score_adj,
            privileged_host_devices: self.privileged_host_devices,
            apparmor_profile: self.apparmor_profile.clone(),
            selinux: self.selinux.as_ref(),
            init: self.init.clone(),
            init_binary: self.init_binary.clone(),
            gpu: self.gpu.as_ref(),
            passed_annotations: self.passed_annotations.clone(),
            sandbox_id: self.sandbox_id.as_deref(),
        };
        build_with(&inputs, &self.host)
    }

    fn spec(&self) -> Spec {
        self.build().expect("spec builds")
    }

    fn invalid(&self) -> String {
        match self.build() {
            Err(SpecError::Invalid(msg)) => msg,
            other => panic!("expected SpecError::Invalid, got {other:?}"),
        }
    }

    fn sc(&mut self) -> &mut cri::LinuxContainerSecurityContext {
        self.config
            .linux
            .get_or_insert_with(Default::default)
            .security_context
            .get_or_insert_with(Default::default)
    }

    fn resources(&mut self) -> &mut cri::LinuxContainerResources {
        self.config
            .linux
            .get_or_insert_with(Default::default)
            .resources
            .get_or_insert_with(Default::default)
    }

    fn privileged_pod(&mut self) {
        self.sandbox
            .linux
            .get_or_insert_with(Default::default)
            .security_context
            .get_or_insert_with(Default::default)
            .privileged = true;
    }

    fn add_mount(&mut self, container_path: &str, host_path: &Path) -> &mut cri::Mount {
        self.config.mounts.push(cri::Mount {
            container_path: container_path.to_string(),
            host_path: host_path.to_string_lossy().into_owned(),
            ..Default::default()
        });
        self.config.mounts.last_mut().unwrap()
    }
}

fn write(root: &Path, rel: &str, content: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn process(spec: &Spec) -> &oci_spec::runtime::Process {
    spec.process().as_ref().unwrap()
}

fn linux(spec: &Spec) -> &oci_spec::runtime::Linux {
    spec.linux().as_ref().unwrap()
}

fn args(spec: &Spec) -> Vec<String> {
    process(spec).args().clone().unwrap()
}

fn env(spec: &Spec) -> Vec<String> {
    process(spec).env().clone().unwrap()
}

fn uid_gid_groups(spec: &Spec) -> (u32, u32, Vec<u32>) {
    let user = process(spec).user();
    (
        user.uid(),
        user.gid(),
        user.additional_gids().clone().unwrap(),
    )
}

fn mounts(spec: &Spec) -> &[Mount] {
    spec.mounts().as_deref().unwrap()
}

fn mount_at<'a>(spec: &'a Spec, destination: &str) -> &'a Mount {
    mounts(spec)
        .iter()
        .find(|m| m.destination() == Path::new(destination))
        .unwrap_or_else(|| panic!("no mount at {destination}"))
}

fn options(mount: &Mount) -> Vec<String> {
    mount.options().clone().unwrap_or_default()
}

fn destinations(spec: &Spec) -> Vec<String> {
    mounts(spec)
        .iter()
        .map(|m| m.destination().display().to_string())
        .collect()
}

fn namespaces(spec: &Spec) -> Vec<(LinuxNamespaceType, Option<PathBuf>)> {
    linux(spec)
        .namespaces()
        .clone()
        .unwrap()
        .iter()
        .map(|n| (n.typ(), n.path().clone()))
        .collect()
}

fn bounding(spec: &Spec) -> HashSet<Capability> {
    process(spec)
        .capabilities()
        .as_ref()
        .unwrap()
        .bounding()
        .clone()
        .unwrap()
}

fn resources(spec: &Spec) -> &oci_spec::runtime::LinuxResources {
    linux(spec).resources().as_ref().unwrap()
}
