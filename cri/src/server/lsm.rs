//! The Linux security modules a container or pod asks for: AppArmor profiles and SELinux labels,
//! checked against what this node's kernel has enabled, never silently dropped. Shared by
//! `RunPodSandbox` and `CreateContainer`.

use std::path::Path;

use crishim_proto::cri;
use crishim_state::records::PodRecord;

use super::errors::Error;

/// The Linux security modules this node's kernel has enabled.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lsm {
    pub apparmor: bool,
    pub selinux: bool,
}

impl Lsm {
    /// Read once: which modules are enabled is fixed at boot.
    pub(super) fn of_host() -> Self {
        static HOST: std::sync::OnceLock<Lsm> = std::sync::OnceLock::new();
        *HOST.get_or_init(|| {
            let apparmor = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
                .is_ok_and(|v| v.trim() == "Y");
            let selinux = std::path::Path::new("/sys/fs/selinux/enforce").exists();
            Lsm { apparmor, selinux }
        })
    }
}

/// AppArmor and SELinux options: never silently dropped. Where AppArmor is enabled, a
/// `Localhost` profile is applied by name (it must be loaded), and `RuntimeDefault` (or nothing
/// asked, as containerd does) gets `crishim-default` unless the container is privileged or asks
/// for `Unconfined`. Where AppArmor is off, `Localhost` is refused and the rest needs nothing. An
/// SELinux label is refused where SELinux is off. Returns the AppArmor profile to apply.
pub(super) fn check_lsm_options(
    config: &cri::ContainerConfig,
    lsm: Lsm,
) -> Result<Option<String>, Error> {
    use cri::security_profile::ProfileType;
    let Some(sc) = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
    else {
        return Ok(lsm
            .apparmor
            .then(|| crishim_spec::apparmor::DEFAULT_PROFILE.to_string()));
    };
    // The typed field, else the deprecated string (`runtime/default`, `localhost/<name>`).
    #[allow(deprecated)]
    let localhost = match &sc.apparmor {
        Some(p) if p.profile_type == ProfileType::Localhost as i32 => Some(p.localhost_ref.clone()),
        Some(_) => None,
        None => sc
            .apparmor_profile
            .strip_prefix("localhost/")
            .map(str::to_string),
    };
    check_selinux("CreateContainer", sc.selinux_options.as_ref(), lsm)?;
    let Some(name) = localhost else {
        #[allow(deprecated)]
        let unconfined = match &sc.apparmor {
            Some(p) => p.profile_type == ProfileType::Unconfined as i32,
            None => sc.apparmor_profile == "unconfined",
        };
        let default = lsm.apparmor && !unconfined && !sc.privileged;
        return Ok(default.then(|| crishim_spec::apparmor::DEFAULT_PROFILE.to_string()));
    };
    if name.is_empty() || name.len() > 256 || name.contains(['\0', '\n']) {
        return Err(Error::invalid_argument(format!(
            "CreateContainer: AppArmor localhost profile {:?} is not a profile name",
            crishim_sys::shown::shown(&name)
        )));
    }
    if !lsm.apparmor {
        return Err(Error::failed_precondition(format!(
            "CreateContainer: AppArmor profile localhost/{name} asked for, but this node's kernel \
             has no AppArmor enabled (/sys/module/apparmor/parameters/enabled is not Y)"
        )));
    }
    Ok(Some(name))
}

/// An SELinux label is taken where SELinux is enabled (its fields checked), and refused, never
/// ignored, where it is not: there is nothing to apply it with.
pub(super) fn check_selinux(
    rpc: &str,
    options: Option<&cri::SeLinuxOption>,
    lsm: Lsm,
) -> Result<(), Error> {
    if !crishim_spec::selinux::asked(options) {
        return Ok(());
    }
    if lsm.selinux {
        return options
            .map_or(Ok(()), crishim_spec::selinux::check)
            .map_err(|m| Error::invalid_argument(format!("{rpc}: {m}")));
    }
    Err(Error::failed_precondition(format!(
        "{rpc}: an SELinux label is asked for, but SELinux is not enabled on this node \
         (no /sys/fs/selinux)"
    )))
}

/// The SELinux labels of a container of `pod`, where the node has SELinux enabled and the
/// container is not privileged (privileged containers run unconfined, as with containerd).
pub(super) fn selinux_labels(
    pod: &PodRecord,
    config: &cri::ContainerConfig,
    lsm: Lsm,
) -> Option<crishim_spec::selinux::Labels> {
    if !lsm.selinux || crishim_gpu::request::is_privileged(config) {
        return None;
    }
    static DEFAULTS: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    let defaults = DEFAULTS.get_or_init(|| crishim_spec::selinux::policy_defaults(Path::new("/")));
    let pod_opt = pod
        .config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.selinux_options.as_ref());
    let own = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.selinux_options.as_ref());
    Some(crishim_spec::selinux::labels(
        defaults,
        pod_opt,
        own,
        &crishim_spec::selinux::pod_level(&pod.id),
    ))
}

#[cfg(test)]
mod tests;
