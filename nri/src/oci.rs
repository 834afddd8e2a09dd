//! NRI's view of a container from its OCI spec, and a merged adjustment applied to the spec
//! as containerd applies it (NRI's `pkg/runtime-tools/generate`).
//!
//! Adjustments reach [`apply`] merged and bounded by [`crate::merge`]; `apply` still converts
//! every value with a check (no plugin value is trusted to fit a spec field), and refuses
//! what the spec cannot hold rather than guessing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    self as oci, Hook, IOPriorityClass, Linux, LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType,
    LinuxIOPriorityBuilder, LinuxNamespace, LinuxNamespaceType, PosixRlimitBuilder,
    PosixRlimitType, Spec,
};

use crate::api;
use crate::limits::{show, unmark};

/// What describes a container besides its spec.
#[derive(Debug, Clone, Default)]
pub struct ContainerMeta {
    pub id: String,
    pub pod_sandbox_id: String,
    pub name: String,
    pub state: api::ContainerState,
    pub labels: HashMap<String, String>,
    /// Nanoseconds since the epoch; 0 for "not yet".
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub pid: u32,
    pub status_reason: String,
    pub status_message: String,
}

/// What [`apply`] left to its caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// CDI devices the plugins asked for, to resolve and inject into the spec.
    pub cdi_devices: Vec<String>,
    /// What the adjustment asked for that the spec was not changed for, for a log line:
    /// "blockio class gold" (classes need a resolver this runtime does not have).
    pub ignored: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApplyError {
    #[error("NRI adjustment: {what} {value} cannot go into an OCI spec")]
    Invalid { what: &'static str, value: String },
    #[error("NRI adjustment: the spec has no {0} to adjust")]
    Missing(&'static str),
}

fn invalid(what: &'static str, value: impl std::fmt::Display) -> ApplyError {
    ApplyError::Invalid {
        what,
        value: show(&value.to_string()),
    }
}

/// The container as NRI plugins see it.
pub fn container(spec: &Spec, meta: ContainerMeta) -> api::Container {
    let process = spec.process().as_ref();
    let linux = spec.linux().as_ref();
    api::Container {
        id: meta.id,
        pod_sandbox_id: meta.pod_sandbox_id,
        name: meta.name,
        state: meta.state as i32,
        labels: meta.labels,
        annotations: spec.annotations().clone().unwrap_or_default(),
        args: process.and_then(|p| p.args().clone()).unwrap_or_default(),
        env: process.and_then(|p| p.env().clone()).unwrap_or_default(),
        mounts: spec.mounts().iter().flatten().map(mount_from_oci).collect(),
        hooks: spec.hooks().as_ref().map(hooks_from_oci),
        linux: Some(api::LinuxContainer {
            namespaces: linux
                .and_then(|l| l.namespaces().as_ref())
                .into_iter()
                .flatten()
                .map(|n| api::LinuxNamespace {
                    r#type: namespace_name(n.typ()).to_string(),
                    path: path_string(n.path().as_deref()),
                })
                .collect(),
            devices: linux
                .and_then(|l| l.devices().as_ref())
                .into_iter()
                .flatten()
                .map(device_from_oci)
                .collect(),
            resources: linux
                .and_then(|l| l.resources().as_ref())
                .map(resources_from_oci),
            oom_score_adj: process
                .and_then(|p| p.oom_score_adj())
                .map(|v| api::OptionalInt { value: v.into() }),
            cgroups_path: path_string(linux.and_then(|l| l.cgroups_path().as_deref())),
            io_priority: process.and_then(|p| p.io_priority().as_ref()).map(|p| {
                api::LinuxIoPriority {
                    class: match p.class() {
                        IOPriorityClass::IoprioClassRt => api::IoPrioClass::IoprioClassRt,
                        IOPriorityClass::IoprioClassBe => api::IoPrioClass::IoprioClassBe,
                        IOPriorityClass::IoprioClassIdle => api::IoPrioClass::IoprioClassIdle,
                    } as i32,
                    priority: i32::try_from(p.priority()).unwrap_or_default(),
                }
            }),
            sysctl: linux.and_then(|l| l.sysctl().clone()).unwrap_or_default(),
            net_devices: linux
                .and_then(|l| l.net_devices().as_ref())
                .into_iter()
                .flatten()
                .map(|(k, v)| {
                    let name = v.name().clone().unwrap_or_default();
                    (k.clone(), api::LinuxNetDevice { name })
                })
                .collect(),
            // Seccomp, scheduling and RDT are not shown to plugins (yet); they may still set them.
            ..Default::default()
        }),
        pid: meta.pid,
        rlimits: process
            .and_then(|p| p.rlimits().as_ref())
            .into_iter()
            .flatten()
            .map(|r| api::PosixRlimit {
                r#type: r.typ().to_string(),
                hard: r.hard(),
                soft: r.soft(),
            })
            .collect(),
        created_at: meta.created_at,
        started_at: meta.started_at,
        finished_at: meta.finished_at,
        exit_code: meta.exit_code,
        status_reason: meta.status_reason,
        status_message: meta.status_message,
        user: process.map(|p| api::User {
            uid: p.user().uid(),
            gid: p.user().gid(),
            additional_gids: p.user().additional_gids().clone().unwrap_or_default(),
        }),
        cdi_devices: Vec::new(),
        image: None,
    }
}

fn path_string(p: Option<&Path>) -> String {
    p.map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// The runtime spec's name of a namespace kind (oci-spec displays some by their short names).
fn namespace_name(t: LinuxNamespaceType) -> &'static str {
    match t {
        LinuxNamespaceType::Mount => "mount",
        LinuxNamespaceType::Cgroup => "cgroup",
        LinuxNamespaceType::Uts => "uts",
        LinuxNamespaceType::Ipc => "ipc",
        LinuxNamespaceType::User => "user",
        LinuxNamespaceType::Pid => "pid",
        LinuxNamespaceType::Network => "network",
        LinuxNamespaceType::Time => "time",
    }
}

fn mount_from_oci(m: &oci::Mount) -> api::Mount {
    api::Mount {
        destination: path_string(Some(m.destination())),
        r#type: m.typ().clone().unwrap_or_default(),
        source: path_string(m.source().as_deref()),
        options: m.options().clone().unwrap_or_default(),
    }
}

fn hook_from_oci(h: &Hook) -> api::Hook {
    api::Hook {
        path: path_string(Some(h.path())),
        args: h.args().clone().unwrap_or_default(),
        env: h.env().clone().unwrap_or_default(),
        timeout: h.timeout().map(|value| api::OptionalInt { value }),
    }
}

#[allow(deprecated)] // prestart hooks: deprecated, still in the spec and in NRI
fn hooks_from_oci(h: &oci::Hooks) -> api::Hooks {
    let kind = |k: &Option<Vec<Hook>>| k.iter().flatten().map(hook_from_oci).collect();
    api::Hooks {
        prestart: kind(h.prestart()),
        create_runtime: kind(h.create_runtime()),
        create_container: kind(h.create_container()),
        start_container: kind(h.start_container()),
        poststart: kind(h.poststart()),
        poststop: kind(h.poststop()),
    }
}

fn device_from_oci(d: &LinuxDevice) -> api::LinuxDevice {
    api::LinuxDevice {
        path: path_string(Some(d.path())),
        r#type: d.typ().as_str().to_string(),
        major: d.major(),
        minor: d.minor(),
        file_mode: d.file_mode().map(|value| api::OptionalFileMode { value }),
        uid: d.uid().map(|value| api::OptionalUInt32 { value }),
        gid: d.gid().map(|value| api::OptionalUInt32 { value }),
    }
}

fn i64_opt(v: Option<i64>) -> Option<api::OptionalInt64> {
    v.map(|value| api::OptionalInt64 { value })
}

fn u64_opt(v: Option<u64>) -> Option<api::OptionalUInt64> {
    v.map(|value| api::OptionalUInt64 { value })
}

/// NRI's resources from the spec's. Kernel memory (obsolete, and not in cgroup v2) is left
/// out; blockio and RDT classes are NRI's own and not in a spec.
pub fn resources_from_oci(r: &oci::LinuxResources) -> api::LinuxResources {
    api::LinuxResources {
        memory: r.memory().map(|m| api::LinuxMemory {
            limit: i64_opt(m.limit()),
            reservation: i64_opt(m.reservation()),
            swap: i64_opt(m.swap()),
            kernel: None,
            kernel_tcp: i64_opt(m.kernel_tcp()),
            swappiness: u64_opt(m.swappiness()),
            disable_oom_killer: m
                .disable_oom_killer()
                .map(|value| api::OptionalBool { value }),
            use_hierarchy: m.use_hierarchy().map(|value| api::OptionalBool { value }),
        }),
        cpu: r.cpu().as_ref().map(|c| api::LinuxCpu {
            shares: u64_opt(c.shares()),
            quota: i64_opt(c.quota()),
            period: u64_opt(c.period()),
            realtime_runtime: i64_opt(c.realtime_runtime()),
            realtime_period: u64_opt(c.realtime_period()),
            cpus: c.cpus().clone().unwrap_or_default(),
            mems: c.mems().clone().unwrap_or_default(),
        }),
        hugepage_limits: r
            .hugepage_limits()
            .iter()
            .flatten()
            .map(|h| api::HugepageLimit {
                page_size: h.page_size().clone(),
                // The spec's i64 and NRI's u64: a negative limit is no memory at all.
                limit: u64::try_from(h.limit()).unwrap_or(0),
            })
            .collect(),
        blockio_class: None,
        rdt_class: None,
        unified: r.unified().clone().unwrap_or_default(),
        devices: r
            .devices()
            .iter()
            .flatten()
            .map(|d| api::LinuxDeviceCgroup {
                allow: d.allow(),
                r#type: d.typ().map(|t| t.as_str().to_string()).unwrap_or_default(),
                major: i64_opt(d.major()),
                minor: i64_opt(d.minor()),
                access: d.access().clone().unwrap_or_default(),
            })
            .collect(),
        pids: r.pids().map(|p| api::LinuxPids { limit: p.limit() }),
    }
}

/// The spec's resources from NRI's (for UpdateContainerResources). What the spec cannot hold
/// is left out: blockio and RDT classes, kernel memory, and device rules of no known type
/// (which [`crate::limits`] refuses from plugins before they get here).
pub fn resources_to_oci(r: &api::LinuxResources) -> oci::LinuxResources {
    let mut out = oci::LinuxResources::default();
    overlay_resources(&mut out, r);
    out
}

/// Sets in `out` what `r` sets.
fn overlay_resources(out: &mut oci::LinuxResources, r: &api::LinuxResources) {
    if let Some(m) = &r.memory {
        let mut t = out.memory().unwrap_or_default();
        let v = |o: &Option<api::OptionalInt64>| o.as_ref().map(|v| v.value);
        if m.limit.is_some() {
            t.set_limit(v(&m.limit));
        }
        if m.reservation.is_some() {
            t.set_reservation(v(&m.reservation));
        }
        if m.swap.is_some() {
            t.set_swap(v(&m.swap));
        }
        if m.kernel_tcp.is_some() {
            t.set_kernel_tcp(v(&m.kernel_tcp));
        }
        if let Some(s) = &m.swappiness {
            t.set_swappiness(Some(s.value));
        }
        if let Some(b) = &m.disable_oom_killer {
            t.set_disable_oom_killer(Some(b.value));
        }
        if let Some(b) = &m.use_hierarchy {
            t.set_use_hierarchy(Some(b.value));
        }
        out.set_memory(Some(t));
    }
    if let Some(c) = &r.cpu {
        let mut t = out.cpu().clone().unwrap_or_default();
        if let Some(v) = &c.shares {
            t.set_shares(Some(v.value));
        }
        if let Some(v) = &c.quota {
            t.set_quota(Some(v.value));
        }
        if let Some(v) = &c.period {
            t.set_period(Some(v.value));
        }
        if let Some(v) = &c.realtime_runtime {
            t.set_realtime_runtime(Some(v.value));
        }
        if let Some(v) = &c.realtime_period {
            t.set_realtime_period(Some(v.value));
        }
        if !c.cpus.is_empty() {
            t.set_cpus(Some(c.cpus.clone()));
        }
        if !c.mems.is_empty() {
            t.set_mems(Some(c.mems.clone()));
        }
        out.set_cpu(Some(t));
    }
    if !r.hugepage_limits.is_empty() {
        let limits = out.hugepage_limits_mut().get_or_insert_default();
        for h in &r.hugepage_limits {
            limits.retain(|l| l.page_size() != &h.page_size);
            let mut l = oci::LinuxHugepageLimit::default();
            l.set_page_size(h.page_size.clone());
            // The spec's i64 and NRI's u64: past i64::MAX is no limit anyway.
            l.set_limit(i64::try_from(h.limit).unwrap_or(i64::MAX));
            limits.push(l);
        }
    }
    if !r.unified.is_empty() {
        let unified = out.unified_mut().get_or_insert_default();
        unified.extend(r.unified.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    if !r.devices.is_empty() {
        let rules = out.devices_mut().get_or_insert_default();
        for d in &r.devices {
            // An unknown type must not become "all devices": the rule is left out.
            let typ = match d.r#type.as_str() {
                "" => None,
                t => match device_type(t) {
                    Some(t @ (LinuxDeviceType::A | LinuxDeviceType::B | LinuxDeviceType::C)) => {
                        Some(t)
                    }
                    _ => continue,
                },
            };
            let mut rule = LinuxDeviceCgroup::default();
            rule.set_allow(d.allow)
                .set_typ(typ)
                .set_major(d.major.as_ref().map(|v| v.value))
                .set_minor(d.minor.as_ref().map(|v| v.value))
                .set_access(non_empty(&d.access));
            rules.push(rule);
        }
    }
    if let Some(p) = &r.pids {
        let mut pids = oci::LinuxPids::default();
        pids.set_limit(p.limit);
        out.set_pids(Some(pids));
    }
}

fn device_type(t: &str) -> Option<LinuxDeviceType> {
    Some(match t {
        "a" => LinuxDeviceType::A,
        "b" => LinuxDeviceType::B,
        "c" => LinuxDeviceType::C,
        "u" => LinuxDeviceType::U,
        "p" => LinuxDeviceType::P,
        _ => return None,
    })
}

/// A `Linux` with nothing in it (`Linux::default()` brings default namespaces and paths).
fn empty_linux() -> Linux {
    let mut l = Linux::default();
    l.set_resources(None)
        .set_namespaces(None)
        .set_masked_paths(None)
        .set_readonly_paths(None);
    l
}

fn linux(spec: &mut Spec) -> &mut Linux {
    spec.linux_mut().get_or_insert_with(empty_linux)
}

fn process(spec: &mut Spec) -> Result<&mut oci::Process, ApplyError> {
    spec.process_mut()
        .as_mut()
        .ok_or(ApplyError::Missing("process"))
}

/// Applies a merged adjustment to the container's spec, as containerd does. CDI devices are
/// not resolved here: they are returned, for the caller to resolve and inject.
///
/// On an error the spec may be partly adjusted: the caller drops it (the creation fails).
pub fn apply(spec: &mut Spec, adjust: &api::ContainerAdjustment) -> Result<Applied, ApplyError> {
    let mut applied = Applied {
        cdi_devices: adjust.cdi_devices.iter().map(|d| d.name.clone()).collect(),
        ignored: Vec::new(),
    };
    apply_annotations(spec, &adjust.annotations);
    if !adjust.env.is_empty() {
        apply_env(process(spec)?, &adjust.env);
    }
    if !adjust.args.is_empty() {
        process(spec)?.set_args(Some(adjust.args.clone()));
    }
    if let Some(h) = &adjust.hooks {
        apply_hooks(spec, h);
    }
    if let Some(l) = &adjust.linux {
        apply_linux(spec, l, &mut applied)?;
    }
    apply_mounts(spec, &adjust.mounts);
    apply_rlimits(spec, &adjust.rlimits)?;
    Ok(applied)
}

fn apply_annotations(spec: &mut Spec, m: &HashMap<String, String>) {
    if m.is_empty() {
        return;
    }
    let out = spec.annotations_mut().get_or_insert_default();
    for (k, v) in m {
        match unmark(k) {
            (key, true) => {
                out.remove(key);
            }
            (key, false) => {
                out.insert(key.to_string(), v.clone());
            }
        }
    }
}

/// Replaces variables in place (keeping the process's order), removes the marked ones, and
/// appends the new ones in the adjustment's order.
fn apply_env(p: &mut oci::Process, env: &[api::KeyValue]) {
    let mut pending: HashMap<&str, &api::KeyValue> =
        env.iter().map(|e| (unmark(&e.key).0, e)).collect();
    let out = p.env_mut().get_or_insert_default();
    out.retain_mut(|var| {
        let key = var.split_once('=').map_or(var.as_str(), |(k, _)| k);
        let Some(e) = pending.remove(key) else {
            return true;
        };
        if unmark(&e.key).1 {
            return false;
        }
        *var = format!("{}={}", e.key, e.value);
        true
    });
    for e in env {
        if !unmark(&e.key).1 && pending.remove(e.key.as_str()).is_some() {
            out.push(format!("{}={}", e.key, e.value));
        }
    }
}

fn hook_to_oci(h: &api::Hook) -> Hook {
    let mut out = Hook::default();
    out.set_path(PathBuf::from(&h.path))
        .set_args((!h.args.is_empty()).then(|| h.args.clone()))
        .set_env((!h.env.is_empty()).then(|| h.env.clone()))
        .set_timeout(h.timeout.as_ref().map(|t| t.value));
    out
}

#[allow(deprecated)] // prestart hooks: deprecated, still in the spec and in NRI
fn apply_hooks(spec: &mut Spec, h: &api::Hooks) {
    let out = spec.hooks_mut().get_or_insert_default();
    let add = |to: &mut Option<Vec<Hook>>, from: &[api::Hook]| {
        if !from.is_empty() {
            to.get_or_insert_default()
                .extend(from.iter().map(hook_to_oci));
        }
    };
    add(out.prestart_mut(), &h.prestart);
    add(out.create_runtime_mut(), &h.create_runtime);
    add(out.create_container_mut(), &h.create_container);
    add(out.start_container_mut(), &h.start_container);
    add(out.poststart_mut(), &h.poststart);
    add(out.poststop_mut(), &h.poststop);
}

fn apply_linux(
    spec: &mut Spec,
    l: &api::LinuxContainerAdjustment,
    applied: &mut Applied,
) -> Result<(), ApplyError> {
    apply_devices(linux(spec), &l.devices)?;
    if !l.cgroups_path.is_empty() {
        linux(spec).set_cgroups_path(Some(PathBuf::from(&l.cgroups_path)));
    }
    if let Some(o) = &l.oom_score_adj {
        let v = i32::try_from(o.value).map_err(|_| invalid("OOM score adjustment", o.value))?;
        process(spec)?.set_oom_score_adj(Some(v));
    }
    if let Some(p) = &l.io_priority {
        let class = match api::IoPrioClass::try_from(p.class) {
            Ok(api::IoPrioClass::IoprioClassNone) => None,
            Ok(api::IoPrioClass::IoprioClassRt) => Some(IOPriorityClass::IoprioClassRt),
            Ok(api::IoPrioClass::IoprioClassBe) => Some(IOPriorityClass::IoprioClassBe),
            Ok(api::IoPrioClass::IoprioClassIdle) => Some(IOPriorityClass::IoprioClassIdle),
            Err(_) => return Err(invalid("I/O priority class", p.class)),
        };
        // No class is no I/O priority, as in NRI.
        let prio = match class {
            Some(c) => Some(
                LinuxIOPriorityBuilder::default()
                    .class(c)
                    .priority(p.priority)
                    .build()
                    .map_err(|e| invalid("I/O priority", e))?,
            ),
            None => None,
        };
        process(spec)?.set_io_priority(prio);
    }
    if let Some(s) = &l.scheduler {
        let sched = scheduler_to_oci(s)?;
        process(spec)?.set_scheduler(sched);
    }
    if let Some(s) = &l.seccomp_policy {
        let seccomp = seccomp_to_oci(s)?;
        linux(spec).set_seccomp(Some(seccomp));
    }
    apply_namespaces(linux(spec), &l.namespaces)?;
    apply_map(linux(spec).sysctl_mut(), &l.sysctl, |v| v.clone());
    apply_map(linux(spec).net_devices_mut(), &l.net_devices, |d| {
        let mut out = oci::LinuxNetDevice::default();
        out.set_name(non_empty(&d.name));
        out
    });
    if let Some(m) = &l.memory_policy {
        let policy = memory_policy_to_oci(m)?;
        linux(spec).set_memory_policy(Some(policy));
    }
    if let Some(r) = &l.resources {
        apply_resources(linux(spec), r, applied);
    }
    if let Some(r) = &l.rdt {
        apply_rdt(linux(spec), r);
    }
    Ok(())
}

/// Adds, replaces or removes devices by path. A device comes with the cgroup rule that lets
/// the container use it; a device removed or replaced takes its rule with it.
fn apply_devices(l: &mut Linux, devices: &[api::LinuxDevice]) -> Result<(), ApplyError> {
    for d in devices {
        let (path, removal) = unmark(&d.path);
        let mut gone = Vec::new();
        if let Some(list) = l.devices_mut() {
            list.retain(|x| {
                let keep = x.path() != Path::new(path);
                if let (false, Some(t)) = (keep, rule_type(x.typ())) {
                    gone.push((t, x.major(), x.minor()));
                }
                keep
            });
        }
        if let Some(rules) = l
            .resources_mut()
            .as_mut()
            .and_then(|r| r.devices_mut().as_mut())
        {
            rules.retain(|r| {
                !(r.allow()
                    && gone.iter().any(|&(t, major, minor)| {
                        r.typ() == Some(t) && r.major() == Some(major) && r.minor() == Some(minor)
                    }))
            });
        }
        if removal {
            continue;
        }
        let typ = device_type(&d.r#type)
            .filter(|t| *t != LinuxDeviceType::A)
            .ok_or_else(|| invalid("device type", &d.r#type))?;
        let mut dev = LinuxDevice::default();
        dev.set_path(PathBuf::from(path))
            .set_typ(typ)
            .set_major(d.major)
            .set_minor(d.minor)
            // A device node needs permission bits only: no set-id or sticky bits from a plugin
            // (and NRI's Go plugins may send Go's file type bits).
            .set_file_mode(d.file_mode.as_ref().map(|m| m.value & 0o777))
            .set_uid(d.uid.as_ref().map(|v| v.value))
            .set_gid(d.gid.as_ref().map(|v| v.value));
        let rule = rule_type(typ).map(|t| {
            let mut rule = LinuxDeviceCgroup::default();
            rule.set_allow(true)
                .set_typ(Some(t))
                .set_major(Some(d.major))
                .set_minor(Some(d.minor))
                .set_access(Some("rwm".into()));
            rule
        });
        l.devices_mut().get_or_insert_default().push(dev);
        if let Some(rule) = rule {
            let resources = l.resources_mut().get_or_insert_default();
            resources.devices_mut().get_or_insert_default().push(rule);
        }
    }
    Ok(())
}

/// The device cgroup's type for a device's: it knows block and character devices only (an
/// unbuffered character device is one), and a FIFO needs no permission from it.
fn rule_type(t: LinuxDeviceType) -> Option<LinuxDeviceType> {
    match t {
        LinuxDeviceType::C | LinuxDeviceType::U => Some(LinuxDeviceType::C),
        LinuxDeviceType::B => Some(LinuxDeviceType::B),
        LinuxDeviceType::P | LinuxDeviceType::A => None,
    }
}

fn scheduler_to_oci(s: &api::LinuxScheduler) -> Result<Option<oci::Scheduler>, ApplyError> {
    use api::LinuxSchedulerPolicy as P;
    use oci::LinuxSchedulerPolicy as O;
    let policy = match P::try_from(s.policy) {
        // No policy is no scheduler settings, as in NRI.
        Ok(P::SchedNone) => return Ok(None),
        Ok(P::SchedOther) => O::SchedOther,
        Ok(P::SchedFifo) => O::SchedFifo,
        Ok(P::SchedRr) => O::SchedRr,
        Ok(P::SchedBatch) => O::SchedBatch,
        Ok(P::SchedIso) => O::SchedIso,
        Ok(P::SchedIdle) => O::SchedIdle,
        Ok(P::SchedDeadline) => O::SchedDeadline,
        Err(_) => return Err(invalid("scheduling policy", s.policy)),
    };
    let flags = s
        .flags
        .iter()
        .map(|f| {
            use api::LinuxSchedulerFlag as F;
            use oci::LinuxSchedulerFlag as G;
            Ok(match F::try_from(*f) {
                Ok(F::SchedFlagResetOnFork) => G::SchedResetOnFork,
                Ok(F::SchedFlagReclaim) => G::SchedFlagReclaim,
                Ok(F::SchedFlagDlOverrun) => G::SchedFlagDLOverrun,
                Ok(F::SchedFlagKeepPolicy) => G::SchedFlagKeepPolicy,
                Ok(F::SchedFlagKeepParams) => G::SchedFlagKeepParams,
                Ok(F::SchedFlagUtilClampMin) => G::SchedFlagUtilClampMin,
                Ok(F::SchedFlagUtilClampMax) => G::SchedFlagUtilClampMax,
                Err(_) => return Err(invalid("scheduling flag", f)),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Zero is "not set", as in the runtime spec's JSON (omitempty).
    let nz32 = |v: i32| (v != 0).then_some(v);
    let nz64 = |v: u64| (v != 0).then_some(v);
    let mut out = oci::Scheduler::default();
    out.set_policy(policy)
        .set_nice(nz32(s.nice))
        .set_priority(nz32(s.priority))
        .set_flags((!flags.is_empty()).then_some(flags))
        .set_runtime(nz64(s.runtime))
        .set_deadline(nz64(s.deadline))
        .set_period(nz64(s.period));
    Ok(Some(out))
}

fn parse<T: std::str::FromStr>(what: &'static str, v: &str) -> Result<T, ApplyError> {
    v.parse().map_err(|_| invalid(what, v))
}

fn seccomp_to_oci(s: &api::LinuxSeccomp) -> Result<oci::LinuxSeccomp, ApplyError> {
    let archs = s
        .architectures
        .iter()
        .map(|a| parse("seccomp architecture", a))
        .collect::<Result<Vec<oci::Arch>, _>>()?;
    let flags = s
        .flags
        .iter()
        .map(|f| parse("seccomp flag", f))
        .collect::<Result<Vec<oci::LinuxSeccompFilterFlag>, _>>()?;
    let mut syscalls = Vec::with_capacity(s.syscalls.len());
    for sc in &s.syscalls {
        let mut args = Vec::with_capacity(sc.args.len());
        for a in &sc.args {
            let mut arg = oci::LinuxSeccompArgBuilder::default()
                .index(a.index as usize)
                .value(a.value)
                .op(parse::<oci::LinuxSeccompOperator>(
                    "seccomp operator",
                    &a.op,
                )?);
            if a.value_two != 0 {
                arg = arg.value_two(a.value_two);
            }
            args.push(arg.build().map_err(|e| invalid("seccomp argument", e))?);
        }
        let mut out = oci::LinuxSyscall::default();
        out.set_names(sc.names.clone())
            .set_action(parse("seccomp action", &sc.action)?)
            .set_errno_ret(sc.errno_ret.as_ref().map(|e| e.value))
            .set_args((!args.is_empty()).then_some(args));
        syscalls.push(out);
    }
    let mut out = oci::LinuxSeccomp::default();
    out.set_default_action(parse("seccomp default action", &s.default_action)?)
        .set_default_errno_ret(s.default_errno.as_ref().map(|e| e.value))
        .set_architectures((!archs.is_empty()).then_some(archs))
        .set_flags((!flags.is_empty()).then_some(flags))
        .set_listener_path(non_empty(&s.listener_path).map(PathBuf::from))
        .set_listener_metadata(non_empty(&s.listener_metadata))
        .set_syscalls((!syscalls.is_empty()).then_some(syscalls));
    Ok(out)
}

/// Adds (or replaces in place) and removes namespaces by kind.
fn apply_namespaces(l: &mut Linux, ns: &[api::LinuxNamespace]) -> Result<(), ApplyError> {
    for n in ns {
        let (kind, removal) = unmark(&n.r#type);
        let typ = LinuxNamespaceType::try_from(kind).map_err(|_| invalid("namespace", kind))?;
        let list = l.namespaces_mut().get_or_insert_default();
        let at = list.iter().position(|x| x.typ() == typ);
        if removal {
            list.retain(|x| x.typ() != typ);
            continue;
        }
        let mut new = LinuxNamespace::default();
        new.set_typ(typ)
            .set_path(non_empty(&n.path).map(PathBuf::from));
        match at {
            Some(i) => list[i] = new,
            None => list.push(new),
        }
    }
    Ok(())
}

fn apply_map<V, W>(out: &mut Option<HashMap<String, W>>, m: &HashMap<String, V>, f: fn(&V) -> W) {
    if m.is_empty() {
        return;
    }
    let out = out.get_or_insert_default();
    for (k, v) in m {
        match unmark(k) {
            (key, true) => {
                out.remove(key);
            }
            (key, false) => {
                out.insert(key.to_string(), f(v));
            }
        }
    }
}

fn memory_policy_to_oci(m: &api::LinuxMemoryPolicy) -> Result<oci::LinuxMemoryPolicy, ApplyError> {
    use api::MpolMode as M;
    use oci::MemoryPolicyModeType as O;
    let mode = match M::try_from(m.mode) {
        Ok(M::MpolDefault) => O::MpolDefault,
        Ok(M::MpolPreferred) => O::MpolPreferred,
        Ok(M::MpolBind) => O::MpolBind,
        Ok(M::MpolInterleave) => O::MpolInterleave,
        Ok(M::MpolLocal) => O::MpolLocal,
        Ok(M::MpolPreferredMany) => O::MpolPreferredMany,
        Ok(M::MpolWeightedInterleave) => O::MpolWeightedInterleave,
        Err(_) => return Err(invalid("memory policy mode", m.mode)),
    };
    let flags = m
        .flags
        .iter()
        .map(|f| {
            use api::MpolFlag as F;
            use oci::MemoryPolicyFlagType as G;
            Ok(match F::try_from(*f) {
                Ok(F::MpolFStaticNodes) => G::MpolFStaticNodes,
                Ok(F::MpolFRelativeNodes) => G::MpolFRelativeNodes,
                Ok(F::MpolFNumaBalancing) => G::MpolFNumaBalancing,
                Err(_) => return Err(invalid("memory policy flag", f)),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = oci::LinuxMemoryPolicy::default();
    out.set_mode(mode)
        .set_nodes(non_empty(&m.nodes))
        .set_flags((!flags.is_empty()).then_some(flags));
    Ok(out)
}

fn apply_resources(l: &mut Linux, r: &api::LinuxResources, applied: &mut Applied) {
    let out = l.resources_mut().get_or_insert_default();
    overlay_resources(out, r);
    // A new memory limit without a swap limit also limits swap to it, as containerd does:
    // an older, lower swap limit would make the spec invalid.
    let limit = r.memory.as_ref().and_then(|m| m.limit.as_ref());
    let swap = r.memory.as_ref().and_then(|m| m.swap.as_ref());
    if let (Some(limit), None) = (limit, swap) {
        let mut m = out.memory().unwrap_or_default();
        m.set_swap(Some(limit.value));
        out.set_memory(Some(m));
    }
    let mut ignore = |what: &str, v: &Option<api::OptionalString>| {
        if let Some(v) = v {
            applied.ignored.push(format!("{what} {}", show(&v.value)));
        }
    };
    ignore("blockio class", &r.blockio_class);
    ignore("RDT class", &r.rdt_class);
    if let Some(k) = r.memory.as_ref().and_then(|m| m.kernel.as_ref()) {
        applied
            .ignored
            .push(format!("kernel memory limit {}", k.value));
    }
}

fn apply_rdt(l: &mut Linux, r: &api::LinuxRdt) {
    if r.remove {
        l.set_intel_rdt(None);
    }
    if r.clos_id.is_none() && r.schemata.is_none() && r.enable_monitoring.is_none() {
        return;
    }
    let out = l.intel_rdt_mut().get_or_insert_default();
    if let Some(c) = &r.clos_id {
        out.set_clos_id(Some(c.value.clone()));
    }
    if let Some(s) = &r.schemata {
        out.set_schemata(Some(s.value.clone()));
    }
    if let Some(m) = &r.enable_monitoring {
        out.set_enable_monitoring(Some(m.value));
    }
}

/// Adds mounts, replacing any at the same destination, and removes the marked ones. Mounts
/// are then ordered parents first, so a mount never lands under one made after it.
fn apply_mounts(spec: &mut Spec, mounts: &[api::Mount]) {
    if mounts.is_empty() {
        return;
    }
    let mut propagation = None;
    let out = spec.mounts_mut().get_or_insert_default();
    for m in mounts {
        let (dest, removal) = unmark(&m.destination);
        out.retain(|x| x.destination() != Path::new(dest));
        if removal {
            continue;
        }
        let mut mount = oci::Mount::default();
        mount
            .set_destination(PathBuf::from(dest))
            .set_typ(non_empty(&m.r#type))
            .set_source(non_empty(&m.source).map(PathBuf::from))
            .set_options((!m.options.is_empty()).then(|| m.options.clone()));
        out.push(mount);
        for o in &m.options {
            match o.as_str() {
                "rshared" => propagation = Some("rshared"),
                "rslave" if propagation != Some("rshared") => propagation = Some("rslave"),
                _ => {}
            }
        }
    }
    out.sort_by_key(|m| m.destination().components().count());
    // A shared or slave mount needs the root to propagate so too, as containerd sets it.
    // (That the host side of the mount propagates is for the runtime to find.)
    if let Some(p) = propagation {
        let root = linux(spec).rootfs_propagation_mut();
        let keep = matches!(root.as_deref(), Some("rshared"))
            || (p == "rslave" && matches!(root.as_deref(), Some("rslave")));
        if !keep {
            *root = Some(p.to_string());
        }
    }
}

/// Sets rlimits, replacing any of the same kind.
fn apply_rlimits(spec: &mut Spec, rlimits: &[api::PosixRlimit]) -> Result<(), ApplyError> {
    if rlimits.is_empty() {
        return Ok(());
    }
    let p = process(spec)?;
    let mut out = p.rlimits().clone().unwrap_or_default();
    for r in rlimits {
        let typ: PosixRlimitType = r.r#type.parse().map_err(|_| invalid("rlimit", &r.r#type))?;
        out.retain(|x| x.typ() != typ);
        let rl = PosixRlimitBuilder::default()
            .typ(typ)
            .hard(r.hard)
            .soft(r.soft)
            .build()
            .map_err(|e| invalid("rlimit", e))?;
        out.push(rl);
    }
    p.set_rlimits(Some(out));
    Ok(())
}

#[cfg(test)]
mod tests;
