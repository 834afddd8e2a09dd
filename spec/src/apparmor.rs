//! The `RuntimeDefault` AppArmor profile, `crishim-default`, in the spirit of containerd's
//! `cri-containerd.apparmor.d`: a container may do what its capabilities and seccomp filter let
//! it, but not reconfigure the host through mounts, `/proc` or `/sys`. Loaded with
//! `apparmor_parser` the first time a container needs it on a node whose kernel has AppArmor.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The profile's name, as containers are confined by it.
pub const DEFAULT_PROFILE: &str = "crishim-default";

/// Where the kernel lists the loaded profiles.
const LOADED: &str = "/sys/kernel/security/apparmor/profiles";

/// The profile, for `apparmor_parser`.
pub fn profile_text() -> String {
    format!(
        r#"abi <abi/3.0>,
#include <tunables/global>

# crishim's RuntimeDefault profile (written by crishim; do not edit, it is replaced on load).
profile {DEFAULT_PROFILE} flags=(attach_disconnected,mediate_deleted) {{
  #include <abstractions/base>

  # What the container's own capabilities and seccomp filter already bound.
  network,
  capability,
  file,
  umount,

  # Signals and tracing only among processes under this profile (and from the runtime).
  signal (send,receive) peer={DEFAULT_PROFILE},
  signal (receive) peer=unconfined,
  ptrace (trace,read,tracedby,readby) peer={DEFAULT_PROFILE},

  # No new mounts, no root switch.
  deny mount,
  deny pivot_root,

  # The host's kernel knobs and memory.
  deny @{{PROC}}/sysrq-trigger rwklx,
  deny @{{PROC}}/kcore rwklx,
  deny @{{PROC}}/kmsg rwklx,
  deny @{{PROC}}/sys/kernel/{{core_pattern,modprobe,hotplug,sysrq,panic*}} wklx,
  deny @{{PROC}}/sys/fs/** wklx,
  deny @{{PROC}}/sys/vm/** wklx,

  # Firmware, security and power interfaces of /sys.
  deny /sys/firmware/** rwklx,
  deny /sys/kernel/security/** rwklx,
  deny /sys/kernel/debug/** rwklx,
  deny /sys/power/** wklx,
}}
"#
    )
}

/// Make sure `crishim-default` is loaded; the outcome of the first try is kept (the kernel keeps
/// the profile until reboot, and a node without `apparmor_parser` will not grow one).
pub fn ensure_default_loaded() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        if is_loaded(&std::fs::read_to_string(LOADED).unwrap_or_default()) {
            return Ok(());
        }
        load(&["-Kr"])
    })
    .clone()
}

/// Whether the kernel's profile list (`name (mode)` per line) holds ours.
fn is_loaded(list: &str) -> bool {
    list.lines()
        .any(|l| l.split(" (").next() == Some(DEFAULT_PROFILE))
}

/// Run `apparmor_parser <args>` on the profile, fed on stdin.
fn load(args: &[&str]) -> Result<(), String> {
    let mut child = Command::new("apparmor_parser")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!(
                "running apparmor_parser to load the {DEFAULT_PROFILE} profile: {e} (install \
                 Debian's apparmor package)"
            )
        })?;
    let text = profile_text();
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| format!("feeding apparmor_parser: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for apparmor_parser: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "apparmor_parser refused the {DEFAULT_PROFILE} profile: {}",
            crishim_sys::shown::shown(stderr.trim())
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loaded_list_is_read_by_name() {
        assert!(is_loaded(
            "docker-default (enforce)\ncrishim-default (enforce)\n"
        ));
        assert!(!is_loaded("crishim-default-x (enforce)\n"));
        assert!(!is_loaded(""));
    }

    /// The profile compiles (`apparmor_parser` with `-Q`: parse and build, no kernel load), so a
    /// node with AppArmor can load it. Debian's `apparmor` package, which the test command
    /// installs, provides the parser even on this kernel without AppArmor.
    #[test]
    fn the_default_profile_compiles() {
        load(&["-Q", "--skip-cache"]).unwrap();
        assert!(profile_text().contains("profile crishim-default "));
    }
}
