//! The container's seccomp filter for exec'd processes.
//!
//! libcontainer 0.7's exec (tenant) path rebuilds `linux` without `seccomp`, so an exec'd process
//! would run unfiltered. crishim loads the filter itself, in its own executor: the last step in the
//! container's init before `execve`. By then the process has dropped to the container's
//! capabilities, and without `no_new_privs` loading a filter needs `CAP_SYS_ADMIN` (runc loads it
//! before the drop). So such a process starts with `CAP_SYS_ADMIN` and `CAP_SETPCAP` added, and
//! the executor drops back to the container's own sets right after the filter is in. The profile
//! must then allow `prctl` and `capset` (RuntimeDefault does, as runc needs them too); if it does
//! not, the exec fails rather than running with the added capabilities.

use oci_spec::runtime::{Capabilities, Capability, LinuxCapabilities, LinuxSeccomp, Process, Spec};

use libcontainer::workload::default::DefaultExecutor;
use libcontainer::workload::{
    Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError,
};

/// What loading a filter needs without `no_new_privs`, and what dropping the bounding set needs.
const LOAD_CAPS: [Capability; 2] = [Capability::SysAdmin, Capability::Setpcap];

#[derive(Clone)]
pub struct SeccompExecutor {
    /// `None` only for an exec'd process joining a user namespace in a container without one.
    seccomp: Option<LinuxSeccomp>,
    /// The pod's user namespace to join first (see `exec_userns`).
    join: Option<crate::exec_userns::UsernsJoin>,
    /// The SELinux process label, written to `/proc/thread-self/attr/exec` last, through a
    /// verified procfs handle (`lsm_attr`).
    label: Option<String>,
    /// The profile compiled once by this shim (`seccomp_program`); `None`: libcontainer builds
    /// it in the process (notify profiles).
    program: Option<std::sync::Arc<crate::seccomp_program::Program>>,
    /// The container's own capabilities, to return to once the filter is loaded; `None` when the
    /// process can load it as it is.
    restore: Option<LinuxCapabilities>,
}

impl SeccompExecutor {
    /// An executor that loads `seccomp` into the exec'd `process`, which gains the capabilities
    /// the load needs when it lacks them.
    pub fn prepare(process: &mut Process, seccomp: LinuxSeccomp) -> Self {
        let restore = needs_load_caps(process).then(|| {
            let own = process.capabilities().clone().unwrap_or_default();
            process.set_capabilities(Some(widened(&own)));
            own
        });
        let program = crate::seccomp_program::cached(&seccomp).unwrap_or_else(|e| {
            eprintln!("crishim-shim: compiling the seccomp profile ({e}); libcontainer will");
            None
        });
        Self {
            seccomp: Some(seccomp),
            join: None,
            label: None,
            program,
            restore,
        }
    }

    /// An executor that only applies the SELinux process label `label`.
    pub fn label_only(label: String) -> Self {
        Self {
            seccomp: None,
            join: None,
            label: Some(label),
            program: None,
            restore: None,
        }
    }

    /// This executor, applying the SELinux process label `label` too.
    pub fn with_label(mut self, label: Option<String>) -> Self {
        self.label = label;
        self
    }

    /// An executor for an exec'd process of a container in the pod's user namespace `join`:
    /// the process starts as the host's root (`join` took its user), joins, then loads
    /// `seccomp` and drops to its own capabilities.
    pub fn for_userns(
        process: &Process,
        seccomp: Option<LinuxSeccomp>,
        join: crate::exec_userns::UsernsJoin,
    ) -> Self {
        let program = seccomp.as_ref().and_then(|s| {
            crate::seccomp_program::cached(s).unwrap_or_else(|e| {
                eprintln!("crishim-shim: compiling the seccomp profile ({e}); libcontainer will");
                None
            })
        });
        Self {
            seccomp,
            join: Some(join),
            label: None,
            program,
            restore: Some(process.capabilities().clone().unwrap_or_default()),
        }
    }
}

impl SeccompExecutor {
    /// Whether the profile was compiled here (not a notify profile, and libseccomp took it).
    pub fn has_program(&self) -> bool {
        self.program.is_some()
    }

    /// Whether the process, once filtered, can still drop the capabilities it gained to load
    /// the filter: no gain was needed, or the profile surely allows `capset` and `prctl`. A
    /// container's init takes this path only then (else libcontainer loads the filter before
    /// the drop, as runc does); for an exec'd process there is no other path.
    pub fn can_drop_back(&self) -> bool {
        self.restore.is_none()
            || self
                .seccomp
                .as_ref()
                .is_none_or(|s| surely_allows(s, "capset") && surely_allows(s, "prctl"))
    }
}

/// Whether `profile` lets the call `name` through whatever its arguments: no rule names it with
/// another action, and either a rule allows it outright or the default does.
fn surely_allows(profile: &LinuxSeccomp, name: &str) -> bool {
    use oci_spec::runtime::LinuxSeccompAction as Act;
    let rules: Vec<_> = profile
        .syscalls()
        .iter()
        .flatten()
        .filter(|r| r.names().iter().any(|n| n == name))
        .collect();
    if rules.iter().any(|r| r.action() != Act::ScmpActAllow) {
        return false;
    }
    rules
        .iter()
        .any(|r| r.args().as_ref().is_none_or(|a| a.is_empty()))
        || profile.default_action() == Act::ScmpActAllow
}

/// Whether the process could not load a filter on its own: no `no_new_privs`, and a capability
/// set without `CAP_SYS_ADMIN`. (No capabilities in the spec means libcontainer keeps them all.)
fn needs_load_caps(process: &Process) -> bool {
    process.no_new_privileges() != Some(true)
        && process.capabilities().as_ref().is_some_and(|c| {
            !c.effective()
                .as_ref()
                .is_some_and(|e| e.contains(&Capability::SysAdmin))
        })
}

/// `caps` with [`LOAD_CAPS`] added to the bounding, effective and permitted sets.
fn widened(caps: &LinuxCapabilities) -> LinuxCapabilities {
    let add = |set: &Option<Capabilities>| {
        let mut set = set.clone().unwrap_or_default();
        set.extend(LOAD_CAPS);
        Some(set)
    };
    let mut out = caps.clone();
    out.set_bounding(add(caps.bounding()))
        .set_effective(add(caps.effective()))
        .set_permitted(add(caps.permitted()));
    out
}

impl Executor for SeccompExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        if let Some(join) = &self.join {
            join.enter().map_err(ExecutorError::Other)?;
        }
        // The label's attribute, opened through a verified procfs handle (a volume over /proc
        // must not take it) before the filter and the capability drop, written last.
        let label = match &self.label {
            Some(label) => Some((
                label,
                crate::lsm_attr::ExecAttr::open().map_err(|e| {
                    ExecutorError::Other(format!("setting the SELinux label {label:?}: {e}"))
                })?,
            )),
            None => None,
        };
        // A notify fd (SCMP_ACT_NOTIFY) has no listener for exec'd processes; closing it makes
        // those calls fail instead of hanging.
        if let Some(program) = &self.program {
            program
                .load()
                .map_err(|e| ExecutorError::Other(format!("loading the seccomp filter: {e}")))?;
        } else if let Some(seccomp) = &self.seccomp {
            // libcontainer reads masked comparisons the other way round: it gets them swapped.
            let translated = crate::seccomp_program::for_libcontainer(seccomp);
            let notify =
                libcontainer::seccomp::initialize_seccomp(translated.as_ref().unwrap_or(seccomp))
                    .map_err(|e| ExecutorError::Other(format!("loading the seccomp filter: {e}")))?;
            if let Some(fd) = notify {
                let _ = nix::unistd::close(fd);
            }
        }
        if let Some(own) = &self.restore {
            let syscall = libcontainer::syscall::syscall::create_syscall();
            libcontainer::capabilities::drop_privileges(own, syscall.as_ref()).map_err(|e| {
                ExecutorError::Other(format!(
                    "dropping the capabilities added to load the seccomp filter \
                     (the profile must allow prctl and capset): {e}"
                ))
            })?;
        }
        if let Some((label, attr)) = label {
            attr.set_label(label).map_err(|e| {
                ExecutorError::Other(format!("setting the SELinux label {label:?}: {e}"))
            })?;
        }
        DefaultExecutor {}.exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        DefaultExecutor {}.validate(spec)
    }

    fn setup_envs(
        &self,
        envs: std::collections::HashMap<String, String>,
    ) -> Result<(), ExecutorSetEnvsError> {
        DefaultExecutor {}.setup_envs(envs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use oci_spec::runtime::{LinuxCapabilitiesBuilder, LinuxSeccompBuilder, ProcessBuilder};

    fn caps(list: &[Capability]) -> LinuxCapabilities {
        let set: Capabilities = list.iter().copied().collect();
        let mut c = LinuxCapabilitiesBuilder::default()
            .bounding(set.clone())
            .effective(set.clone())
            .permitted(set)
            .build()
            .unwrap();
        c.set_inheritable(None).set_ambient(None);
        c
    }

    fn process(nnp: Option<bool>, own: &[Capability]) -> Process {
        let mut p = ProcessBuilder::default()
            .args(vec!["true".to_string()])
            .capabilities(caps(own))
            .build()
            .unwrap();
        p.set_no_new_privileges(nnp);
        p
    }

    fn seccomp() -> LinuxSeccomp {
        LinuxSeccompBuilder::default().build().unwrap()
    }

    #[test]
    fn a_process_without_no_new_privs_gains_the_load_caps_and_gives_them_back() {
        let own = [Capability::Chown, Capability::NetBindService];
        let mut p = process(None, &own);
        let ex = SeccompExecutor::prepare(&mut p, seccomp());
        let got = p.capabilities().clone().unwrap();
        for set in [got.bounding(), got.effective(), got.permitted()] {
            let set = set.as_ref().unwrap();
            assert!(LOAD_CAPS.iter().all(|c| set.contains(c)));
            assert!(own.iter().all(|c| set.contains(c)));
        }
        assert_eq!(ex.restore, Some(caps(&own)));
    }

    #[test]
    fn only_a_profile_that_surely_allows_capset_and_prctl_lets_the_caps_drop_back() {
        use oci_spec::runtime::{LinuxSeccompAction as Act, LinuxSyscallBuilder};
        let rule = |names: &[&str], action: Act| {
            LinuxSyscallBuilder::default()
                .names(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .action(action)
                .build()
                .unwrap()
        };
        let profile = |default: Act, rules: Vec<_>| {
            LinuxSeccompBuilder::default()
                .default_action(default)
                .syscalls(rules)
                .build()
                .unwrap()
        };
        let widened = |s: LinuxSeccomp| {
            let mut p = process(None, &[Capability::Chown]);
            SeccompExecutor::prepare(&mut p, s)
        };
        // RuntimeDefault's shape: deny by default, an allowlist naming both.
        let allowlist = profile(
            Act::ScmpActErrno,
            vec![rule(&["capset", "prctl", "read"], Act::ScmpActAllow)],
        );
        assert!(widened(allowlist).can_drop_back());
        let missing = profile(
            Act::ScmpActErrno,
            vec![rule(&["capset"], Act::ScmpActAllow)],
        );
        assert!(!widened(missing).can_drop_back());
        let denied = profile(
            Act::ScmpActAllow,
            vec![rule(&["capset"], Act::ScmpActErrno)],
        );
        assert!(!widened(denied).can_drop_back());
        assert!(widened(profile(Act::ScmpActAllow, vec![])).can_drop_back());
        // No gain needed: nothing to drop back.
        let mut p = process(Some(true), &[Capability::Chown]);
        let denied = profile(
            Act::ScmpActAllow,
            vec![rule(&["capset"], Act::ScmpActErrno)],
        );
        assert!(SeccompExecutor::prepare(&mut p, denied).can_drop_back());
    }

    #[test]
    fn no_new_privs_or_sys_admin_loads_as_it_is() {
        for (nnp, own) in [
            (Some(true), vec![Capability::Chown]),
            (None, vec![Capability::SysAdmin]),
        ] {
            let mut p = process(nnp, &own);
            let before = p.clone();
            let ex = SeccompExecutor::prepare(&mut p, seccomp());
            assert_eq!(ex.restore, None);
            assert_eq!(p, before);
        }
    }
}
