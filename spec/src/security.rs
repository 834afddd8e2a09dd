//! The security context: privileged mode, capabilities, masked and read-only /proc paths and
//! the seccomp profile, with containerd's semantics.

use std::path::Path;

use crishim_proto::cri;
use oci_spec::runtime::{Capabilities, Capability, LinuxCapabilities, LinuxSeccomp};

use super::host::HostFacts;
use super::{seccomp, SpecError};

/// containerd's `defaultUnixCaps`, Docker's default set.
pub(super) const DEFAULT_CAPS: [Capability; 14] = [
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Mknod,
    Capability::NetRaw,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];

/// containerd's default `maskedPaths`.
pub(super) const DEFAULT_MASKED_PATHS: [&str; 11] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
    "/proc/scsi",
];

/// containerd's default `readonlyPaths`.
pub(super) const DEFAULT_READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// A privileged container needs a privileged pod, as in containerd (the kubelet checks this
/// too, but a CRI client may not).
pub(super) fn check_privileged_allowed(
    privileged: bool,
    sandbox: &cri::PodSandboxConfig,
) -> Result<(), SpecError> {
    let pod_privileged = sandbox
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .is_some_and(|sc| sc.privileged);
    if privileged && !pod_privileged {
        return Err(SpecError::Invalid(
            "privileged container requested in a pod that is not privileged".to_string(),
        ));
    }
    Ok(())
}

/// The default set, then "ALL" added or dropped, then single capabilities added, then dropped
/// (so `add: [ALL], drop: [CHOWN]` is everything but CHOWN). A privileged container gets all the
/// daemon has. Names may carry the `CAP_` prefix or not, in any case.
pub(super) fn capabilities(
    sc: Option<&cri::LinuxContainerSecurityContext>,
    privileged: bool,
    host: &HostFacts,
) -> Result<Capabilities, SpecError> {
    if privileged {
        return Ok(host.current_caps.clone());
    }
    let mut caps: Capabilities = DEFAULT_CAPS.into_iter().collect();
    let Some(requested) = sc.and_then(|sc| sc.capabilities.as_ref()) else {
        return Ok(caps);
    };
    let is_all = |name: &String| name.eq_ignore_ascii_case("ALL");
    if requested.add_capabilities.iter().any(is_all) {
        caps = host.current_caps.clone();
    }
    if requested.drop_capabilities.iter().any(is_all) {
        caps.clear();
    }
    for name in requested.add_capabilities.iter().filter(|n| !is_all(n)) {
        caps.insert(parse_capability(name)?);
    }
    for name in requested.drop_capabilities.iter().filter(|n| !is_all(n)) {
        caps.remove(&parse_capability(name)?);
    }
    Ok(caps)
}

fn parse_capability(name: &str) -> Result<Capability, SpecError> {
    // oci-spec's deserializer takes "CAP_X" and "X" in any case.
    serde_json::from_value(serde_json::Value::String(name.to_string()))
        .map_err(|_| SpecError::Invalid(format!("unknown capability {name:?}")))
}

/// Bounding, effective and permitted; no inheritable or ambient ones, as containerd (since
/// 1.7) does, so that a non-root process gains nothing across exec.
pub(super) fn linux_capabilities(caps: Capabilities) -> LinuxCapabilities {
    let mut out = LinuxCapabilities::default();
    out.set_bounding(Some(caps.clone()))
        .set_effective(Some(caps.clone()))
        .set_permitted(Some(caps))
        .set_inheritable(None)
        .set_ambient(None);
    out
}

/// The CRI lists, or containerd's defaults when they are empty; none for a privileged container.
pub(super) fn masked_and_readonly_paths(
    sc: Option<&cri::LinuxContainerSecurityContext>,
    privileged: bool,
) -> (Vec<String>, Vec<String>) {
    if privileged {
        return (Vec::new(), Vec::new());
    }
    let or_default = |requested: Option<&Vec<String>>, default: &[&str]| match requested {
        Some(list) if !list.is_empty() => list.clone(),
        _ => default.iter().map(|p| p.to_string()).collect(),
    };
    (
        or_default(sc.map(|sc| &sc.masked_paths), &DEFAULT_MASKED_PATHS),
        or_default(sc.map(|sc| &sc.readonly_paths), &DEFAULT_READONLY_PATHS),
    )
}

/// No filter for privileged or unconfined containers or when nothing is asked for; the
/// RuntimeDefault profile (built for the final bounding set, as containerd's) or a node-local
/// JSON profile otherwise. The deprecated `seccomp_profile_path` is honoured when `seccomp` is
/// unset.
pub(super) fn seccomp(
    sc: Option<&cri::LinuxContainerSecurityContext>,
    privileged: bool,
    bounding: &Capabilities,
) -> Result<Option<LinuxSeccomp>, SpecError> {
    use cri::security_profile::ProfileType;
    let Some(sc) = sc else { return Ok(None) };
    if privileged {
        return Ok(None);
    }
    let profile = match &sc.seccomp {
        Some(profile) => profile.clone(),
        None => match profile_from_path(deprecated_profile_path(sc))? {
            Some(profile) => profile,
            None => return Ok(None),
        },
    };
    let profile_type = ProfileType::try_from(profile.profile_type).map_err(|_| {
        SpecError::Invalid(format!(
            "unknown seccomp profile type {}",
            profile.profile_type
        ))
    })?;
    if profile_type != ProfileType::Localhost && !profile.localhost_ref.is_empty() {
        return Err(SpecError::Invalid(
            "seccomp localhost_ref may only be set for a Localhost profile".to_string(),
        ));
    }
    match profile_type {
        ProfileType::Unconfined => Ok(None),
        ProfileType::RuntimeDefault => Ok(Some(seccomp::default_profile(bounding))),
        ProfileType::Localhost => load_localhost_profile(&profile.localhost_ref).map(Some),
    }
}

#[allow(deprecated)]
fn deprecated_profile_path(sc: &cri::LinuxContainerSecurityContext) -> &str {
    &sc.seccomp_profile_path
}

/// The pre-1.19 string form: "", "unconfined", "runtime/default", "docker/default" or
/// "localhost/<path>".
fn profile_from_path(path: &str) -> Result<Option<cri::SecurityProfile>, SpecError> {
    use cri::security_profile::ProfileType;
    let (profile_type, localhost_ref) = match path {
        "" => return Ok(None),
        "unconfined" => (ProfileType::Unconfined, String::new()),
        "runtime/default" | "docker/default" => (ProfileType::RuntimeDefault, String::new()),
        _ => match path.strip_prefix("localhost/") {
            Some(file) => (ProfileType::Localhost, file.to_string()),
            None => {
                return Err(SpecError::Invalid(format!(
                    "invalid seccomp profile {path:?}"
                )))
            }
        },
    };
    Ok(Some(cri::SecurityProfile {
        profile_type: profile_type as i32,
        localhost_ref,
    }))
}

/// The largest Localhost seccomp profile read.
const MAX_SECCOMP_PROFILE_BYTES: u64 = 1 << 20;

/// A profile file on the node, in the OCI `linux.seccomp` JSON form.
fn load_localhost_profile(localhost_ref: &str) -> Result<LinuxSeccomp, SpecError> {
    let path = localhost_ref
        .strip_prefix("localhost/")
        .unwrap_or(localhost_ref);
    if !Path::new(path).is_absolute() {
        return Err(SpecError::Invalid(format!(
            "seccomp profile path {path:?} is not absolute"
        )));
    }
    // The pod names the path: a regular file of at most 1 MiB (containerd's profile is 20 KiB),
    // never a device or a FIFO that would stall or fill the daemon.
    let limits = crishim_sys::confined::Limits::in_root(MAX_SECCOMP_PROFILE_BYTES);
    let text = crishim_sys::confined::read(Path::new("/"), path.trim_start_matches('/'), limits)
        .map_err(|e| SpecError::Invalid(format!("cannot load seccomp profile {path:?}: {e}")))?;
    serde_json::from_slice(&text)
        .map_err(|e| SpecError::Invalid(format!("invalid seccomp profile {path:?}: {e}")))
}
