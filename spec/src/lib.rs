//! Building a container's OCI runtime spec (`config.json`) from the image config, the CRI
//! `ContainerConfig` and its pod, the way containerd's CRI plugin does.
//!
//! The inputs are plain data, so the whole translation is unit-tested without a kernel. The few
//! facts read from the node (cgroup version, the daemon's capabilities, ...) are gathered in
//! [`HostFacts`] so tests can pin them.
//!
//! [`build`] returns the whole spec: what the daemon decides on the host first (the AppArmor
//! profile, the SELinux labels, the init binary, the GPU plan, the annotations a handler passes)
//! comes in [`SpecInputs`] too. Host actions (loading a profile, preparing the GPUs, staging the
//! binds of a user namespace's container, which rewrites their sources) stay the caller's.
//!
//! Each concern lives in its own module: `process` (args, env, cwd, rlimits), `user` (uid, gids
//! from the image's /etc/passwd and /etc/group), `mounts`, `namespaces`, `devices`, `security`
//! (capabilities, privileged, masked paths, seccomp), `seccomp` (the RuntimeDefault profile) and
//! `resources` (cgroup limits, oom score, sysctls).

use std::collections::HashMap;

use crishim_proto::cri;
use oci_spec::runtime::{Linux, LinuxDevice, Process, Root, Spec};

pub mod apparmor;
pub mod cgroups;
pub mod selinux;
pub mod userns;

mod caps;
mod devices;
mod error;
mod host;
mod inputs;
mod kernel_mounts;
mod mounts;
pub use mounts::is_image_volume;
mod namespaces;
mod process;
mod resources;
mod seccomp;
mod security;
pub(crate) mod user;

#[cfg(test)]
mod tests;

pub use error::SpecError;
pub use inputs::{Built, ImageVolume, PodFiles, PodNamespaces, SpecInputs};

pub(crate) use host::is_cgroup_v2;
use host::HostFacts;

/// Annotation keys containerd's CRI plugin sets on every container's spec.
pub const ANNOTATION_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
pub const ANNOTATION_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
pub const ANNOTATION_IMAGE_NAME: &str = "io.kubernetes.cri.image-name";
pub const ANNOTATION_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
pub const ANNOTATION_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
pub const ANNOTATION_SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
pub const ANNOTATION_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";

/// Where the init binary appears inside the container.
pub const INIT_PATH: &str = crishim_proto::init::PATH;

/// Builds the OCI runtime spec for one container.
/// `noNewPrivileges` as libcontainer needs it: absent unless set. libcontainer installs a seccomp
/// filter early, while still privileged, only when the field is absent; an explicit `false` takes
/// the late path, after capabilities are dropped, where loading the filter fails with EPERM.
fn no_new_privileges(set: bool) -> Option<bool> {
    set.then_some(true)
}

/// The cgroup limits of `resources` alone, for `UpdateContainerResources` on a running container:
/// device rules are left as they are.
pub fn resources(
    resources: &cri::LinuxContainerResources,
) -> Result<oci_spec::runtime::LinuxResources, SpecError> {
    let config = cri::ContainerConfig {
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(resources.clone()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut out = resources::build(&config, Vec::new(), &HostFacts::detect())?;
    out.set_devices(None);
    Ok(out)
}

/// The spec of one container, whole, and the pod's binds in it.
pub fn build(inputs: &SpecInputs<'_>) -> Result<Built, SpecError> {
    build_with(inputs, &HostFacts::detect())
}

/// The device nodes [`build`] gives the container before the GPU plan's edits: among these, the
/// GPU's host step sees what CDI devices grant.
pub fn devices(inputs: &SpecInputs<'_>) -> Result<Vec<LinuxDevice>, SpecError> {
    Ok(device_nodes(inputs, &HostFacts::detect())?.nodes)
}

fn device_nodes(inputs: &SpecInputs<'_>, host: &HostFacts) -> Result<devices::Devices, SpecError> {
    let privileged = security_context(inputs.config).is_some_and(|sc| sc.privileged);
    devices::build(
        inputs.config,
        privileged && inputs.privileged_host_devices,
        host,
    )
}

/// [`build`] against given node facts.
fn build_with(inputs: &SpecInputs<'_>, host: &HostFacts) -> Result<Built, SpecError> {
    let config = inputs.config;
    let image = inputs.image.config().as_ref();
    let sc = security_context(config);
    let privileged = sc.is_some_and(|sc| sc.privileged);
    security::check_privileged_allowed(privileged, inputs.sandbox)?;

    let capabilities = security::capabilities(sc, privileged, host)?;
    let seccomp = security::seccomp(sc, privileged, &capabilities)?;
    let devices = device_nodes(inputs, host)?;
    kernel_mounts::check(config)?;
    let mut mounts = mounts::build(config, &inputs.files, inputs.image_volumes, privileged)?;
    let joins_pid_ns = !inputs.namespaces.host_pid && inputs.namespaces.pid.is_some();
    // In a user namespace, cgroup v1 cannot be mounted at all: the binds are the only way.
    let in_userns = inputs.namespaces.user.is_some();
    if !host.cgroup_v2 && (joins_pid_ns || in_userns) && inputs.cgroups_path.starts_with('/') {
        mounts::emulate_cgroup_v1(
            &mut mounts.mounts,
            &host.cgroup_v1_dirs,
            &inputs.cgroups_path,
        );
    }

    let mut process = Process::default();
    process
        .set_terminal(Some(config.tty))
        .set_args(Some(process::args(config, image)?))
        .set_env(Some(process::env(
            config,
            image,
            &pod_hostname(inputs, host),
        )?))
        .set_cwd(process::cwd(config, image))
        .set_user(user::resolve(
            &inputs.rootfs,
            sc,
            image.and_then(|c| c.user().as_deref()),
        )?)
        .set_capabilities(Some(security::linux_capabilities(capabilities)))
        .set_rlimits(Some(process::rlimits(host.nofile_hard)))
        .set_no_new_privileges(no_new_privileges(sc.is_some_and(|sc| sc.no_new_privs)))
        .set_oom_score_adj(resources::oom_score_adj(config, inputs.min_oom_score_adj));

    let (masked_paths, readonly_paths) = security::masked_and_readonly_paths(sc, privileged);
    let cgroups_path =
        (!inputs.cgroups_path.is_empty()).then(|| inputs.cgroups_path.clone().into());
    let mut linux = Linux::default();
    linux
        .set_namespaces(Some(namespaces::build(
            &inputs.namespaces,
            host.cgroup_v2 && !privileged,
        )))
        .set_devices(Some(devices.nodes))
        .set_resources(Some(resources::build(config, devices.rules, host)?))
        .set_cgroups_path(cgroups_path)
        .set_rootfs_propagation(mounts.rootfs_propagation)
        .set_masked_paths(Some(masked_paths))
        .set_readonly_paths(Some(readonly_paths))
        .set_sysctl(resources::sysctls(inputs.sandbox))
        .set_seccomp(seccomp);

    let mut root = Root::default();
    root.set_path(inputs.rootfs.clone())
        .set_readonly(Some(sc.is_some_and(|sc| sc.readonly_rootfs)));

    // Every field `Spec::default()` fills (hostname "youki", its own mounts, ...) is set here.
    let mut spec = Spec::default();
    spec.set_version(oci_spec::runtime::VERSION.to_string())
        .set_root(Some(root))
        .set_mounts(Some(mounts.mounts))
        .set_process(Some(process))
        .set_hostname(namespaces::hostname(&inputs.namespaces, inputs.sandbox))
        .set_annotations(Some(annotations(config, inputs.sandbox)))
        .set_linux(Some(linux));

    // The edits below are made in this order: each sees the spec as the ones before left it.
    if let Some(profile) = &inputs.apparmor_profile {
        if let Some(process) = spec.process_mut() {
            process.set_apparmor_profile(Some(profile.clone()));
        }
    }
    if let Some(labels) = inputs.selinux {
        // libcontainer puts the mount label on its tmpfs mounts; the shim's executor applies
        // the process label (libcontainer applies none).
        if let Some(process) = spec.process_mut() {
            process.set_selinux_label(Some(labels.process.clone()));
        }
        if let Some(linux) = spec.linux_mut() {
            linux.set_mount_label(Some(labels.file.clone()));
        }
    }
    let pod_binds = userns::PodBinds::of(&spec);
    let raw_env = spec
        .process()
        .as_ref()
        .and_then(|p| p.env().as_ref())
        .is_some_and(|env| env.iter().any(|e| process::is_raw_env(e)));
    match (&inputs.init, &inputs.init_binary) {
        (Some(binary), _) => add_init(&mut spec, binary, false)?,
        // Only init can give the process a value that is not UTF-8.
        (None, Some(binary)) if raw_env => add_init(&mut spec, binary, true)?,
        (None, None) if raw_env => {
            return Err(SpecError::Invalid(
                "an environment value that is not UTF-8 reaches the process through                  crishim-init, which is not installed"
                    .into(),
            ))
        }
        _ => {}
    }
    if let Some(plan) = inputs.gpu {
        plan.apply_to(&mut spec).map_err(|e| match e {
            crishim_gpu::GpuError::Invalid(m) => SpecError::Invalid(m),
            e => SpecError::Internal(e.to_string()),
        })?;
    }
    let mut annotations = spec.annotations().clone().unwrap_or_default();
    for (key, value) in &inputs.passed_annotations {
        if !annotations.contains_key(key) {
            annotations.insert(key.clone(), value.clone());
        }
    }
    if let Some(id) = inputs.sandbox_id {
        annotations.insert(ANNOTATION_SANDBOX_ID.into(), id.to_string());
    }
    spec.set_annotations(Some(annotations));
    Ok(Built { spec, pod_binds })
}

/// Run the program under `binary`, bind-mounted read-only at [`INIT_PATH`]: as PID 1 that reaps,
/// or (`exec_only`) only to set the environment and exec the program in place.
fn add_init(spec: &mut Spec, binary: &std::path::Path, exec_only: bool) -> Result<(), SpecError> {
    let mount = oci_spec::runtime::MountBuilder::default()
        .destination(INIT_PATH)
        .typ("bind")
        .source(binary)
        .options(vec![
            "rbind".to_string(),
            "ro".to_string(),
            "nosuid".to_string(),
            "nodev".to_string(),
        ])
        .build()
        .map_err(|e| SpecError::internal("init mount", e))?;
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    mounts.push(mount);
    spec.set_mounts(Some(mounts));
    if let Some(process) = spec.process_mut() {
        let mut args = vec![INIT_PATH.to_string()];
        if exec_only {
            args.push(crishim_proto::init::EXEC_FLAG.to_string());
        }
        args.push("--".to_string());
        args.extend(process.args().clone().unwrap_or_default());
        process.set_args(Some(args));
    }
    Ok(())
}

fn security_context(config: &cri::ContainerConfig) -> Option<&cri::LinuxContainerSecurityContext> {
    config.linux.as_ref()?.security_context.as_ref()
}

/// The pod's hostname, for `HOSTNAME=`; a host-network pod may send none, and then, as in
/// containerd, the node's own name is what the container sees.
fn pod_hostname(inputs: &SpecInputs<'_>, host: &HostFacts) -> String {
    if inputs.sandbox.hostname.is_empty() {
        host.hostname.clone()
    } else {
        inputs.sandbox.hostname.clone()
    }
}

/// The CRI annotations are copied, then containerd's own (which win, as in containerd).
fn annotations(
    config: &cri::ContainerConfig,
    sandbox: &cri::PodSandboxConfig,
) -> HashMap<String, String> {
    let mut out = config.annotations.clone();
    let meta = sandbox.metadata.clone().unwrap_or_default();
    let image = config.image.clone().unwrap_or_default();
    let image_name = if image.user_specified_image.is_empty() {
        image.image
    } else {
        image.user_specified_image
    };
    let container_name = config
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    for (key, value) in [
        (ANNOTATION_SANDBOX_NAMESPACE, meta.namespace),
        (ANNOTATION_SANDBOX_UID, meta.uid),
        (ANNOTATION_SANDBOX_NAME, meta.name),
        (ANNOTATION_CONTAINER_NAME, container_name),
        (ANNOTATION_IMAGE_NAME, image_name),
        (ANNOTATION_CONTAINER_TYPE, "container".to_string()),
    ] {
        out.insert(key.to_string(), value);
    }
    out
}
