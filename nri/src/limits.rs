//! Bounds on what one plugin may ask for. A plugin is hostile until bounded: every reply is
//! checked here, whole, before anything in it is merged or applied, and the merged result is
//! held to the same bounds, so many plugins together cannot exceed what one may not.
//!
//! The wire already caps a message at 4 MiB; these bounds keep what reaches the container's
//! spec (and the kernel, through it) to sizes and shapes a container can legitimately need.

use std::collections::HashMap;

use crate::api;
use crate::merge::MergeError;

/// Environment variables one adjustment sets or removes.
pub const MAX_ENV: usize = 1024;
/// Bytes of one environment variable's name.
pub const MAX_ENV_KEY: usize = 1024;
/// Bytes of one environment variable's value.
pub const MAX_ENV_VALUE: usize = 32 * 1024;
/// Bytes of all environment variables' names and values together.
pub const MAX_ENV_BYTES: usize = 256 * 1024;
/// Annotations one adjustment sets or removes.
pub const MAX_ANNOTATIONS: usize = 256;
/// Bytes of all annotations' keys and values together.
pub const MAX_ANNOTATION_BYTES: usize = 64 * 1024;
/// Mounts one adjustment adds or removes.
pub const MAX_MOUNTS: usize = 256;
/// Options of one mount.
pub const MAX_MOUNT_OPTIONS: usize = 64;
/// OCI hooks of all kinds together.
pub const MAX_HOOKS: usize = 64;
/// Arguments, and environment entries, of one hook.
pub const MAX_HOOK_ARGS: usize = 256;
/// Devices one adjustment adds or removes.
pub const MAX_DEVICES: usize = 256;
/// Device cgroup rules in one set of resources.
pub const MAX_DEVICE_RULES: usize = 256;
/// CDI devices one adjustment injects.
pub const MAX_CDI_DEVICES: usize = 64;
/// Bytes of one CDI device name (`vendor/class=name`).
pub const MAX_CDI_NAME: usize = 256;
/// Arguments of the container's process.
pub const MAX_ARGS: usize = 1024;
/// Bytes of all the process's arguments together (the kernel's limit for one is 128 KiB).
pub const MAX_ARGS_BYTES: usize = 128 * 1024;
/// Rlimits: there are 16 kinds.
pub const MAX_RLIMITS: usize = 16;
/// Sysctls one adjustment sets or removes.
pub const MAX_SYSCTL: usize = 64;
/// Bytes of one sysctl's name.
pub const MAX_SYSCTL_KEY: usize = 256;
/// Unified (cgroup v2) settings in one set of resources.
pub const MAX_UNIFIED: usize = 64;
/// Bytes of one unified setting's key, a cgroup file name.
pub const MAX_UNIFIED_KEY: usize = 256;
/// Hugepage limits: one per page size, and a node has a few.
pub const MAX_HUGEPAGE_LIMITS: usize = 16;
/// Bytes of one hugepage size name ("2MB", "1GB").
pub const MAX_PAGE_SIZE: usize = 16;
/// Namespaces: there are 8 kinds.
pub const MAX_NAMESPACES: usize = 16;
/// Network devices moved into the container.
pub const MAX_NET_DEVICES: usize = 16;
/// Bytes of a network interface name (IFNAMSIZ less its NUL).
pub const MAX_IFNAME: usize = 15;
/// Bytes of a path: a mount's destination or source, a device's, a hook's, the cgroups path.
pub const MAX_PATH: usize = 4096;
/// Bytes of any other single string: a mount option, a sysctl or unified value, a class name.
pub const MAX_VALUE: usize = 4096;
/// Bytes of a name: a mount type, a blockio/RDT class, an RDT CLOS id, a seccomp action.
pub const MAX_NAME: usize = 256;
/// Syscall rules in a seccomp policy.
pub const MAX_SECCOMP_SYSCALLS: usize = 1024;
/// Syscall names in one seccomp rule.
pub const MAX_SECCOMP_NAMES: usize = 512;
/// Argument conditions of one seccomp rule: a syscall has 6 arguments.
pub const MAX_SECCOMP_ARGS: usize = 6;
/// Architectures, and flags, of a seccomp policy.
pub const MAX_SECCOMP_ARCHES: usize = 32;
/// RDT schemata lines.
pub const MAX_RDT_SCHEMATA: usize = 64;
/// Scheduler or memory policy flags.
pub const MAX_FLAGS: usize = 16;
/// Other containers one plugin's reply updates.
pub const MAX_UPDATES: usize = 256;
/// Containers one plugin's reply evicts.
pub const MAX_EVICTIONS: usize = 256;
/// Bytes of a container id.
pub const MAX_ID: usize = 256;
/// Bytes of an eviction's reason.
pub const MAX_REASON: usize = 1024;

/// The rlimits a process may have (`man 2 setrlimit`).
pub const RLIMITS: [&str; 16] = [
    "RLIMIT_AS",
    "RLIMIT_CORE",
    "RLIMIT_CPU",
    "RLIMIT_DATA",
    "RLIMIT_FSIZE",
    "RLIMIT_LOCKS",
    "RLIMIT_MEMLOCK",
    "RLIMIT_MSGQUEUE",
    "RLIMIT_NICE",
    "RLIMIT_NOFILE",
    "RLIMIT_NPROC",
    "RLIMIT_RSS",
    "RLIMIT_RTPRIO",
    "RLIMIT_RTTIME",
    "RLIMIT_SIGPENDING",
    "RLIMIT_STACK",
];

/// The namespace kinds, as the runtime spec names them (and the short names runtimes accept).
pub const NAMESPACES: [&str; 10] = [
    "pid", "network", "net", "mount", "mnt", "ipc", "uts", "user", "cgroup", "time",
];

/// `key` without its removal marker, and whether it had one: NRI marks "remove this from the
/// container" by a leading '-' on the key, name, path or destination.
pub fn unmark(key: &str) -> (&str, bool) {
    match key.strip_prefix('-') {
        Some(k) => (k, true),
        None => (key, false),
    }
}

/// A plugin's string, shortened for an error message: a hostile plugin's megabyte-long key
/// must not become a megabyte-long log line.
pub(crate) fn show(s: &str) -> String {
    const SHOW: usize = 64;
    match s.char_indices().nth(SHOW) {
        Some((end, _)) => format!("{:?}...", &s[..end]),
        None => format!("{s:?}"),
    }
}

fn invalid(plugin: &str, reason: String) -> MergeError {
    MergeError::Invalid {
        plugin: plugin.to_string(),
        reason,
    }
}

fn count(plugin: &str, what: &str, n: usize, limit: usize) -> Result<(), MergeError> {
    if n > limit {
        return Err(MergeError::TooLarge {
            plugin: plugin.to_string(),
            what: what.to_string(),
            limit,
        });
    }
    Ok(())
}

/// A string of at most `max` bytes with no NUL (nothing with a NUL survives the trip into the
/// kernel intact).
fn text(plugin: &str, what: &str, s: &str, max: usize) -> Result<(), MergeError> {
    count(plugin, &format!("bytes of {what}"), s.len(), max)?;
    if s.contains('\0') {
        return Err(invalid(
            plugin,
            format!("{what} {} has a NUL byte", show(s)),
        ));
    }
    Ok(())
}

/// An absolute path with no `..` component, so it names what it seems to.
fn abs_path(plugin: &str, what: &str, p: &str) -> Result<(), MergeError> {
    text(plugin, what, p, MAX_PATH)?;
    if !p.starts_with('/') {
        return Err(invalid(
            plugin,
            format!("{what} {} is not absolute", show(p)),
        ));
    }
    no_dotdot(plugin, what, p)
}

fn no_dotdot(plugin: &str, what: &str, p: &str) -> Result<(), MergeError> {
    if p.split('/').any(|c| c == "..") {
        return Err(invalid(plugin, format!("{what} {} has a '..'", show(p))));
    }
    Ok(())
}

/// A name that becomes one file name (a cgroup file, an RDT group, a network interface).
fn file_name(plugin: &str, what: &str, s: &str, max: usize) -> Result<(), MergeError> {
    text(plugin, what, s, max)?;
    if s.is_empty() || s == "." || s == ".." || s.contains('/') {
        return Err(invalid(
            plugin,
            format!("{what} {} is not a file name", show(s)),
        ));
    }
    Ok(())
}

/// Checks one plugin's adjustment of the container being created.
pub fn check_adjustment(plugin: &str, a: &api::ContainerAdjustment) -> Result<(), MergeError> {
    check_annotations(plugin, &a.annotations)?;
    check_mounts(plugin, &a.mounts)?;
    check_env(plugin, &a.env)?;
    if let Some(h) = &a.hooks {
        check_hooks(plugin, h)?;
    }
    check_rlimits(plugin, &a.rlimits)?;
    check_cdi_devices(plugin, &a.cdi_devices)?;
    check_args(plugin, &a.args)?;
    if let Some(l) = &a.linux {
        check_linux(plugin, l)?;
    }
    Ok(())
}

/// Checks one plugin's updates of other containers.
pub fn check_updates(plugin: &str, updates: &[api::ContainerUpdate]) -> Result<(), MergeError> {
    count(plugin, "container updates", updates.len(), MAX_UPDATES)?;
    for u in updates {
        container_id(plugin, &u.container_id)?;
        if let Some(r) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) {
            check_resources(plugin, r)?;
        }
    }
    Ok(())
}

/// Checks one plugin's evictions.
pub fn check_evictions(plugin: &str, ev: &[api::ContainerEviction]) -> Result<(), MergeError> {
    count(plugin, "evictions", ev.len(), MAX_EVICTIONS)?;
    for e in ev {
        container_id(plugin, &e.container_id)?;
        text(plugin, "eviction reason", &e.reason, MAX_REASON)?;
    }
    Ok(())
}

fn container_id(plugin: &str, id: &str) -> Result<(), MergeError> {
    text(plugin, "container id", id, MAX_ID)?;
    if id.is_empty() {
        return Err(invalid(plugin, "empty container id".into()));
    }
    Ok(())
}

fn check_annotations(plugin: &str, m: &HashMap<String, String>) -> Result<(), MergeError> {
    count(plugin, "annotations", m.len(), MAX_ANNOTATIONS)?;
    let bytes = m.iter().map(|(k, v)| k.len().saturating_add(v.len()));
    count(
        plugin,
        "bytes of annotations",
        bytes.fold(0usize, usize::saturating_add),
        MAX_ANNOTATION_BYTES,
    )?;
    for k in m.keys() {
        if unmark(k).0.is_empty() {
            return Err(invalid(plugin, "empty annotation key".into()));
        }
    }
    Ok(())
}

fn check_mounts(plugin: &str, mounts: &[api::Mount]) -> Result<(), MergeError> {
    count(plugin, "mounts", mounts.len(), MAX_MOUNTS)?;
    for m in mounts {
        let (dest, removal) = unmark(&m.destination);
        abs_path(plugin, "mount destination", dest)?;
        if removal {
            continue;
        }
        text(plugin, "mount source", &m.source, MAX_PATH)?;
        text(plugin, "mount type", &m.r#type, MAX_NAME)?;
        count(plugin, "mount options", m.options.len(), MAX_MOUNT_OPTIONS)?;
        for o in &m.options {
            text(plugin, "mount option", o, MAX_VALUE)?;
        }
    }
    Ok(())
}

fn check_env(plugin: &str, env: &[api::KeyValue]) -> Result<(), MergeError> {
    count(plugin, "environment variables", env.len(), MAX_ENV)?;
    let mut bytes = 0usize;
    for e in env {
        let key = unmark(&e.key).0;
        text(plugin, "environment variable name", key, MAX_ENV_KEY)?;
        if key.is_empty() || key.contains('=') {
            return Err(invalid(
                plugin,
                format!("environment variable name {} is not a name", show(key)),
            ));
        }
        text(
            plugin,
            "environment variable value",
            &e.value,
            MAX_ENV_VALUE,
        )?;
        bytes = bytes
            .saturating_add(e.key.len())
            .saturating_add(e.value.len());
    }
    count(plugin, "bytes of environment", bytes, MAX_ENV_BYTES)
}

fn check_hooks(plugin: &str, h: &api::Hooks) -> Result<(), MergeError> {
    let kinds = [
        &h.prestart,
        &h.create_runtime,
        &h.create_container,
        &h.start_container,
        &h.poststart,
        &h.poststop,
    ];
    let n = kinds
        .iter()
        .map(|k| k.len())
        .fold(0usize, usize::saturating_add);
    count(plugin, "hooks", n, MAX_HOOKS)?;
    for hook in kinds.into_iter().flatten() {
        abs_path(plugin, "hook path", &hook.path)?;
        count(plugin, "hook arguments", hook.args.len(), MAX_HOOK_ARGS)?;
        count(
            plugin,
            "hook environment entries",
            hook.env.len(),
            MAX_HOOK_ARGS,
        )?;
        for s in hook.args.iter().chain(&hook.env) {
            text(plugin, "hook argument", s, MAX_VALUE)?;
        }
        // The runtime spec wants a hook's timeout greater than zero.
        if hook.timeout.as_ref().is_some_and(|t| t.value <= 0) {
            return Err(invalid(plugin, "hook timeout is not positive".into()));
        }
    }
    Ok(())
}

fn check_rlimits(plugin: &str, rlimits: &[api::PosixRlimit]) -> Result<(), MergeError> {
    count(plugin, "rlimits", rlimits.len(), MAX_RLIMITS)?;
    for r in rlimits {
        if !RLIMITS.contains(&r.r#type.as_str()) {
            return Err(invalid(
                plugin,
                format!("unknown rlimit {}", show(&r.r#type)),
            ));
        }
        // setrlimit(2) refuses a soft limit over the hard one; say so here, naming the plugin.
        if r.soft > r.hard {
            return Err(invalid(
                plugin,
                format!("rlimit {} has soft limit over hard limit", r.r#type),
            ));
        }
    }
    Ok(())
}

fn check_cdi_devices(plugin: &str, devices: &[api::CdiDevice]) -> Result<(), MergeError> {
    count(plugin, "CDI devices", devices.len(), MAX_CDI_DEVICES)?;
    for d in devices {
        text(plugin, "CDI device name", &d.name, MAX_CDI_NAME)?;
        // vendor/class=name; CDI devices can only be added, so no removal marker either.
        let shaped = match d.name.split_once('=') {
            Some((kind, name)) => {
                !name.is_empty()
                    && kind
                        .split_once('/')
                        .is_some_and(|(v, c)| !v.is_empty() && !c.is_empty())
            }
            None => false,
        };
        if !shaped || d.name.starts_with('-') {
            return Err(invalid(
                plugin,
                format!("CDI device name {} is not vendor/class=name", show(&d.name)),
            ));
        }
    }
    Ok(())
}

fn check_args(plugin: &str, args: &[String]) -> Result<(), MergeError> {
    count(plugin, "arguments", args.len(), MAX_ARGS)?;
    let bytes = args
        .iter()
        .map(String::len)
        .fold(0usize, usize::saturating_add);
    count(plugin, "bytes of arguments", bytes, MAX_ARGS_BYTES)?;
    for a in args {
        text(plugin, "argument", a, MAX_ARGS_BYTES)?;
    }
    Ok(())
}

fn check_linux(plugin: &str, l: &api::LinuxContainerAdjustment) -> Result<(), MergeError> {
    check_devices(plugin, &l.devices)?;
    if let Some(r) = &l.resources {
        check_resources(plugin, r)?;
    }
    if !l.cgroups_path.is_empty() {
        text(plugin, "cgroups path", &l.cgroups_path, MAX_PATH)?;
        no_dotdot(plugin, "cgroups path", &l.cgroups_path)?;
        // The systemd form is slice:prefix:name; its parts must not climb either.
        if l.cgroups_path.split(':').any(|c| c == "..") {
            return Err(invalid(plugin, "cgroups path has a '..'".into()));
        }
    }
    if let Some(o) = &l.oom_score_adj {
        // The kernel's range; anything else would also not fit the spec's i32.
        if !(-1000..=1000).contains(&o.value) {
            return Err(invalid(
                plugin,
                format!("OOM score adjustment {} is outside -1000..=1000", o.value),
            ));
        }
    }
    if let Some(p) = &l.io_priority {
        if api::IoPrioClass::try_from(p.class).is_err() || !(0..=7).contains(&p.priority) {
            return Err(invalid(
                plugin,
                format!(
                    "I/O priority class {} level {} is not valid",
                    p.class, p.priority
                ),
            ));
        }
    }
    if let Some(s) = &l.seccomp_policy {
        check_seccomp(plugin, s)?;
    }
    check_namespaces(plugin, &l.namespaces)?;
    check_sysctl(plugin, &l.sysctl)?;
    check_net_devices(plugin, &l.net_devices)?;
    if let Some(s) = &l.scheduler {
        let policy = api::LinuxSchedulerPolicy::try_from(s.policy).is_ok();
        let flags = s
            .flags
            .iter()
            .all(|f| api::LinuxSchedulerFlag::try_from(*f).is_ok());
        count(plugin, "scheduler flags", s.flags.len(), MAX_FLAGS)?;
        if !policy || !flags || !(-20..=19).contains(&s.nice) || !(0..=99).contains(&s.priority) {
            return Err(invalid(plugin, "scheduler settings are not valid".into()));
        }
    }
    if let Some(r) = &l.rdt {
        if let Some(c) = &r.clos_id {
            // The CLOS id names a resctrl group, a directory.
            if !c.value.is_empty() {
                file_name(plugin, "RDT CLOS id", &c.value, MAX_NAME)?;
            }
        }
        if let Some(s) = &r.schemata {
            count(plugin, "RDT schemata", s.value.len(), MAX_RDT_SCHEMATA)?;
            for line in &s.value {
                text(plugin, "RDT schema", line, MAX_VALUE)?;
            }
        }
    }
    if let Some(m) = &l.memory_policy {
        count(plugin, "memory policy flags", m.flags.len(), MAX_FLAGS)?;
        text(plugin, "memory policy nodes", &m.nodes, MAX_VALUE)?;
        let valid = api::MpolMode::try_from(m.mode).is_ok()
            && m.flags.iter().all(|f| api::MpolFlag::try_from(*f).is_ok());
        if !valid {
            return Err(invalid(plugin, "memory policy is not valid".into()));
        }
    }
    Ok(())
}

fn check_devices(plugin: &str, devices: &[api::LinuxDevice]) -> Result<(), MergeError> {
    count(plugin, "devices", devices.len(), MAX_DEVICES)?;
    for d in devices {
        let (path, removal) = unmark(&d.path);
        abs_path(plugin, "device path", path)?;
        if !path.starts_with("/dev/") {
            return Err(invalid(
                plugin,
                format!("device path {} is not under /dev", show(path)),
            ));
        }
        if removal {
            continue;
        }
        if !matches!(d.r#type.as_str(), "c" | "b" | "u" | "p") {
            return Err(invalid(
                plugin,
                format!(
                    "device {} has type {}, not c, b, u or p",
                    show(path),
                    show(&d.r#type)
                ),
            ));
        }
        // Linux device numbers: 12 bits of major, 20 of minor.
        if !(0..1 << 12).contains(&d.major) || !(0..1 << 20).contains(&d.minor) {
            return Err(invalid(
                plugin,
                format!(
                    "device {} number {}:{} is not valid",
                    show(path),
                    d.major,
                    d.minor
                ),
            ));
        }
    }
    Ok(())
}

/// Checks a set of resources, an adjustment's or an update's.
pub fn check_resources(plugin: &str, r: &api::LinuxResources) -> Result<(), MergeError> {
    count(
        plugin,
        "hugepage limits",
        r.hugepage_limits.len(),
        MAX_HUGEPAGE_LIMITS,
    )?;
    for h in &r.hugepage_limits {
        text(plugin, "hugepage size", &h.page_size, MAX_PAGE_SIZE)?;
        if h.page_size.is_empty() || !h.page_size.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(invalid(
                plugin,
                format!("hugepage size {} is not a size", show(&h.page_size)),
            ));
        }
    }
    count(
        plugin,
        "unified cgroup settings",
        r.unified.len(),
        MAX_UNIFIED,
    )?;
    for (k, v) in &r.unified {
        // The key is a file in the container's cgroup directory: it must stay in it.
        file_name(plugin, "unified cgroup key", k, MAX_UNIFIED_KEY)?;
        if k.starts_with('-') {
            return Err(invalid(
                plugin,
                format!("unified cgroup key {} is not a file", show(k)),
            ));
        }
        text(plugin, "unified cgroup value", v, MAX_VALUE)?;
    }
    count(
        plugin,
        "device cgroup rules",
        r.devices.len(),
        MAX_DEVICE_RULES,
    )?;
    for d in &r.devices {
        let access = d.access.len() <= 3 && d.access.chars().all(|c| matches!(c, 'r' | 'w' | 'm'));
        if !matches!(d.r#type.as_str(), "" | "a" | "b" | "c") || !access {
            return Err(invalid(
                plugin,
                format!(
                    "device cgroup rule type {} access {} is not valid",
                    show(&d.r#type),
                    show(&d.access)
                ),
            ));
        }
    }
    if let Some(c) = &r.cpu {
        text(plugin, "cpuset CPUs", &c.cpus, MAX_VALUE)?;
        text(plugin, "cpuset memory nodes", &c.mems, MAX_VALUE)?;
    }
    if let Some(s) = r.memory.as_ref().and_then(|m| m.swappiness.as_ref()) {
        if s.value > 100 {
            return Err(invalid(
                plugin,
                format!("memory swappiness {} is over 100", s.value),
            ));
        }
    }
    if let Some(c) = &r.blockio_class {
        text(plugin, "blockio class", &c.value, MAX_NAME)?;
    }
    if let Some(c) = &r.rdt_class {
        text(plugin, "RDT class", &c.value, MAX_NAME)?;
    }
    Ok(())
}

fn check_seccomp(plugin: &str, s: &api::LinuxSeccomp) -> Result<(), MergeError> {
    text(
        plugin,
        "seccomp default action",
        &s.default_action,
        MAX_NAME,
    )?;
    count(
        plugin,
        "seccomp architectures",
        s.architectures.len(),
        MAX_SECCOMP_ARCHES,
    )?;
    count(plugin, "seccomp flags", s.flags.len(), MAX_SECCOMP_ARCHES)?;
    for a in s.architectures.iter().chain(&s.flags) {
        text(plugin, "seccomp architecture or flag", a, MAX_NAME)?;
    }
    if !s.listener_path.is_empty() {
        abs_path(plugin, "seccomp listener path", &s.listener_path)?;
    }
    text(
        plugin,
        "seccomp listener metadata",
        &s.listener_metadata,
        MAX_VALUE,
    )?;
    count(
        plugin,
        "seccomp syscall rules",
        s.syscalls.len(),
        MAX_SECCOMP_SYSCALLS,
    )?;
    for sc in &s.syscalls {
        count(
            plugin,
            "seccomp syscall names",
            sc.names.len(),
            MAX_SECCOMP_NAMES,
        )?;
        for n in &sc.names {
            text(plugin, "seccomp syscall name", n, MAX_NAME)?;
        }
        text(plugin, "seccomp action", &sc.action, MAX_NAME)?;
        count(
            plugin,
            "seccomp syscall arguments",
            sc.args.len(),
            MAX_SECCOMP_ARGS,
        )?;
        for a in &sc.args {
            text(plugin, "seccomp operator", &a.op, MAX_NAME)?;
            if a.index as usize >= MAX_SECCOMP_ARGS {
                return Err(invalid(
                    plugin,
                    format!("seccomp argument index {}", a.index),
                ));
            }
        }
    }
    Ok(())
}

fn check_namespaces(plugin: &str, ns: &[api::LinuxNamespace]) -> Result<(), MergeError> {
    count(plugin, "namespaces", ns.len(), MAX_NAMESPACES)?;
    for n in ns {
        let kind = unmark(&n.r#type).0;
        if !NAMESPACES.contains(&kind) {
            return Err(invalid(
                plugin,
                format!("unknown namespace {}", show(&n.r#type)),
            ));
        }
        if !n.path.is_empty() {
            abs_path(plugin, "namespace path", &n.path)?;
        }
    }
    Ok(())
}

fn check_sysctl(plugin: &str, m: &HashMap<String, String>) -> Result<(), MergeError> {
    count(plugin, "sysctls", m.len(), MAX_SYSCTL)?;
    for (k, v) in m {
        let key = unmark(k).0;
        text(plugin, "sysctl name", key, MAX_SYSCTL_KEY)?;
        // A sysctl name becomes a path under /proc/sys: every part is a plain name, so none
        // is empty or "..", and nothing else can reach out of /proc/sys.
        let plain = |c: &str| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-@+:".contains(&b))
        };
        if !key.split(['.', '/']).all(plain) {
            return Err(invalid(
                plugin,
                format!("sysctl name {} is not valid", show(key)),
            ));
        }
        text(plugin, "sysctl value", v, MAX_VALUE)?;
    }
    Ok(())
}

fn check_net_devices(
    plugin: &str,
    m: &HashMap<String, api::LinuxNetDevice>,
) -> Result<(), MergeError> {
    count(plugin, "network devices", m.len(), MAX_NET_DEVICES)?;
    let ifname = |what: &str, s: &str| -> Result<(), MergeError> {
        file_name(plugin, what, s, MAX_IFNAME)?;
        if s.contains(|c: char| c.is_whitespace() || c == ':') {
            return Err(invalid(
                plugin,
                format!("{what} {} is not an interface name", show(s)),
            ));
        }
        Ok(())
    };
    for (k, v) in m {
        ifname("network device", unmark(k).0)?;
        if !v.name.is_empty() {
            ifname("network device name", &v.name)?;
        }
    }
    Ok(())
}
