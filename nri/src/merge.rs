//! The replies of several plugins to one CreateContainer, merged into one adjustment of the
//! container being created, one update per other container and a list of evictions, as NRI's
//! runtime side does (`pkg/adaptation/result.go`).
//!
//! Plugins are merged in the order they were called (their index order). Each field of each
//! container has at most one owner: a second plugin that sets what another set (the same
//! environment variable, mount destination, memory limit, ...) fails the merge with
//! [`MergeError::Conflict`] naming the field and both plugins. A plugin may set its own field
//! again. Hooks, and device cgroup rules, are appended and conflict with nothing.
//!
//! Removal, as in NRI: a key, name, path or destination with a leading '-' removes it from
//! the container. A removal takes the key from whoever set it before, and owns it: a later
//! plugin that sets it conflicts with the remover. A reply that both removes and sets a key
//! replaces it whoever owned it. A first argument of "" likewise lets a plugin replace
//! arguments another plugin set.
//!
//! Every reply is checked against [`crate::limits`] before it is merged, and the merged result
//! is held to the same limits. After an error the merge is spoiled: the container's creation
//! fails, as in NRI.

use std::collections::{BTreeMap, HashMap};

use crate::api::{self, Field};
use crate::limits::{self, show, unmark};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MergeError {
    /// Two plugins set the same field.
    #[error("plugins {first:?} and {second:?} both adjust {what}")]
    Conflict {
        what: String,
        first: String,
        second: String,
    },
    /// A plugin sent something malformed.
    #[error("plugin {plugin:?}: {reason}")]
    Invalid { plugin: String, reason: String },
    /// A plugin sent more than a container may have.
    #[error("plugin {plugin:?}: {what} over the limit of {limit}")]
    TooLarge {
        plugin: String,
        what: String,
        limit: usize,
    },
}

/// All plugins' replies, merged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Merged {
    /// The adjustment of the container being created, to apply to its spec.
    pub adjust: api::ContainerAdjustment,
    /// Updates of other containers, one per container, in the order first asked for.
    pub updates: Vec<api::ContainerUpdate>,
    /// Containers to evict, each once, with the first reason given.
    pub evictions: Vec<api::ContainerEviction>,
    /// Which plugin owns which field of which container (for ValidateContainerAdjustment);
    /// a removal's owner is the plugin's name marked with '-', hooks' owners joined by ','.
    pub owners: api::OwningPlugins,
}

/// Merges plugins' replies to the CreateContainer of one container.
#[derive(Debug)]
pub struct Merge {
    owners: Owners,
    adjust: api::ContainerAdjustment,
    updates: Vec<api::ContainerUpdate>,
    evictions: Vec<api::ContainerEviction>,
}

impl Merge {
    /// A merge for the creation of `container` (as created, before any adjustment).
    pub fn new(container: &api::Container) -> Self {
        Merge {
            owners: Owners::new(&container.id),
            adjust: api::ContainerAdjustment::default(),
            updates: Vec::new(),
            evictions: Vec::new(),
        }
    }

    /// Merges one plugin's whole reply.
    pub fn reply(
        &mut self,
        plugin: &str,
        reply: api::CreateContainerResponse,
    ) -> Result<(), MergeError> {
        if let Some(a) = reply.adjust {
            self.adjust(plugin, a)?;
        }
        self.update(plugin, reply.update)?;
        self.evict(plugin, reply.evict)
    }

    /// Merges one plugin's adjustment of the container being created.
    pub fn adjust(&mut self, plugin: &str, a: api::ContainerAdjustment) -> Result<(), MergeError> {
        limits::check_adjustment(plugin, &a)?;
        let id = self.owners.created.clone();
        let (o, out) = (&mut self.owners, &mut self.adjust);

        merge_map(
            o,
            &id,
            Field::Annotations,
            plugin,
            &mut out.annotations,
            a.annotations,
        )?;
        merge_list(
            o,
            &id,
            Field::Mounts,
            plugin,
            &mut out.mounts,
            a.mounts,
            mount_key,
        )?;
        merge_list(o, &id, Field::Env, plugin, &mut out.env, a.env, env_key)?;
        if let Some(mut args) = (!a.args.is_empty()).then_some(a.args) {
            if args[0].is_empty() {
                o.remove(&id, Field::Args, None, plugin);
                args.remove(0);
            }
            o.claim(&id, Field::Args, None, plugin)?;
            out.args = args;
        }
        if let Some(h) = a.hooks {
            merge_hooks(o, plugin, out, h);
        }
        if let Some(l) = a.linux {
            merge_linux(o, &id, plugin, out.linux.get_or_insert_default(), l)?;
        }
        for r in a.rlimits {
            o.claim(&id, Field::Rlimits, Some(&r.r#type), plugin)?;
            out.rlimits.retain(|x| x.r#type != r.r#type);
            out.rlimits.push(r);
        }
        for d in a.cdi_devices {
            o.claim(&id, Field::CdiDevices, Some(&d.name), plugin)?;
            if !out.cdi_devices.contains(&d) {
                out.cdi_devices.push(d);
            }
        }
        // All plugins together get no more than one.
        limits::check_adjustment(plugin, &self.adjust)
    }

    /// Merges one plugin's updates of other containers. An update that conflicts with another
    /// plugin's is dropped if it said failure may be ignored, else it fails the merge.
    pub fn update(
        &mut self,
        plugin: &str,
        updates: Vec<api::ContainerUpdate>,
    ) -> Result<(), MergeError> {
        limits::check_updates(plugin, &updates)?;
        for u in updates {
            if u.container_id == self.owners.created {
                return Err(MergeError::Invalid {
                    plugin: plugin.to_string(),
                    reason: format!(
                        "asked to update container {} while it is being created",
                        show(&u.container_id)
                    ),
                });
            }
            let Some(resources) = u.linux.and_then(|l| l.resources) else {
                continue;
            };
            match self
                .owners
                .claim_all(&u.container_id, &resource_claims(&resources), plugin)
            {
                Err(e) if u.ignore_failure => {
                    tracing::debug!("NRI: dropping an update that may fail: {e}");
                    continue;
                }
                r => r?,
            }
            let at = match self
                .updates
                .iter()
                .position(|x| x.container_id == u.container_id)
            {
                Some(at) => {
                    self.updates[at].ignore_failure &= u.ignore_failure;
                    at
                }
                None => {
                    self.updates.push(api::ContainerUpdate {
                        container_id: u.container_id,
                        linux: Some(api::LinuxContainerUpdate::default()),
                        ignore_failure: u.ignore_failure,
                    });
                    self.updates.len() - 1
                }
            };
            let target = self.updates[at]
                .linux
                .get_or_insert_default()
                .resources
                .get_or_insert_default();
            // Device rules cannot change in a running container's update.
            merge_resources(target, resources, false);
            limits::check_resources(plugin, target)?;
        }
        if self.updates.len() > limits::MAX_UPDATES {
            return Err(MergeError::TooLarge {
                plugin: plugin.to_string(),
                what: "container updates".into(),
                limit: limits::MAX_UPDATES,
            });
        }
        Ok(())
    }

    /// Collects one plugin's evictions.
    pub fn evict(
        &mut self,
        plugin: &str,
        evictions: Vec<api::ContainerEviction>,
    ) -> Result<(), MergeError> {
        limits::check_evictions(plugin, &evictions)?;
        for e in evictions {
            if !self
                .evictions
                .iter()
                .any(|x| x.container_id == e.container_id)
            {
                self.evictions.push(e);
            }
        }
        if self.evictions.len() > limits::MAX_EVICTIONS {
            return Err(MergeError::TooLarge {
                plugin: plugin.to_string(),
                what: "evictions".into(),
                limit: limits::MAX_EVICTIONS,
            });
        }
        Ok(())
    }

    /// The adjustment merged so far.
    pub fn adjustment(&self) -> &api::ContainerAdjustment {
        &self.adjust
    }

    pub fn finish(self) -> Merged {
        Merged {
            adjust: self.adjust,
            updates: self.updates,
            evictions: self.evictions,
            owners: self.owners.into_api(),
        }
    }
}

fn mount_key(m: &api::Mount) -> &str {
    &m.destination
}

fn env_key(e: &api::KeyValue) -> &str {
    &e.key
}

fn device_key(d: &api::LinuxDevice) -> &str {
    &d.path
}

fn namespace_key(n: &api::LinuxNamespace) -> &str {
    &n.r#type
}

/// Merges a list keyed by `key` (mounts, env, devices, namespaces): removals first, so a reply
/// that removes and sets a key replaces it, then sets. A removal stays in the result, for the
/// spec, unless the same reply sets the key again.
fn merge_list<T>(
    o: &mut Owners,
    id: &str,
    field: Field,
    plugin: &str,
    out: &mut Vec<T>,
    incoming: Vec<T>,
    key: fn(&T) -> &str,
) -> Result<(), MergeError> {
    let (removals, sets): (Vec<T>, Vec<T>) = incoming.into_iter().partition(|x| unmark(key(x)).1);
    for r in &removals {
        let k = unmark(key(r)).0;
        o.remove(id, field, Some(k), plugin);
        out.retain(|x| unmark(key(x)).0 != k);
    }
    for s in sets {
        o.claim(id, field, Some(key(&s)), plugin)?;
        out.retain(|x| unmark(key(x)).0 != key(&s));
        out.push(s);
    }
    for r in removals {
        let k = unmark(key(&r)).0;
        if !out.iter().any(|x| unmark(key(x)).0 == k) {
            out.push(r);
        }
    }
    Ok(())
}

/// Merges a map (annotations, sysctls, network devices) as [`merge_list`] does a list; a
/// removal is the marked key with a default value.
fn merge_map<V: Default>(
    o: &mut Owners,
    id: &str,
    field: Field,
    plugin: &str,
    out: &mut HashMap<String, V>,
    incoming: HashMap<String, V>,
) -> Result<(), MergeError> {
    // Sorted, so that of several conflicts the same one is reported every time.
    let (removals, sets): (BTreeMap<_, _>, BTreeMap<_, _>) =
        incoming.into_iter().partition(|(k, _)| unmark(k).1);
    for k in removals.into_keys() {
        let key = unmark(&k).0;
        o.remove(id, field, Some(key), plugin);
        out.remove(key);
        out.insert(k, V::default());
    }
    for (k, v) in sets {
        o.claim(id, field, Some(&k), plugin)?;
        out.remove(&format!("-{k}"));
        out.insert(k, v);
    }
    Ok(())
}

fn merge_hooks(o: &mut Owners, plugin: &str, out: &mut api::ContainerAdjustment, h: api::Hooks) {
    let t = out.hooks.get_or_insert_default();
    let mut added = false;
    for (to, from) in [
        (&mut t.prestart, h.prestart),
        (&mut t.create_runtime, h.create_runtime),
        (&mut t.create_container, h.create_container),
        (&mut t.start_container, h.start_container),
        (&mut t.poststart, h.poststart),
        (&mut t.poststop, h.poststop),
    ] {
        added |= !from.is_empty();
        to.extend(from);
    }
    if added && o.hooks.last().map(String::as_str) != Some(plugin) {
        o.hooks.push(plugin.to_string());
    }
}

fn merge_linux(
    o: &mut Owners,
    id: &str,
    plugin: &str,
    out: &mut api::LinuxContainerAdjustment,
    l: api::LinuxContainerAdjustment,
) -> Result<(), MergeError> {
    merge_list(
        o,
        id,
        Field::Devices,
        plugin,
        &mut out.devices,
        l.devices,
        device_key,
    )?;
    if let Some(r) = l.resources {
        o.claim_all(id, &resource_claims(&r), plugin)?;
        merge_resources(out.resources.get_or_insert_default(), r, true);
    }
    if !l.cgroups_path.is_empty() {
        o.claim(id, Field::CgroupsPath, None, plugin)?;
        out.cgroups_path = l.cgroups_path;
    }
    claim_set(
        o,
        id,
        Field::OomScoreAdj,
        plugin,
        &mut out.oom_score_adj,
        l.oom_score_adj,
    )?;
    claim_set(
        o,
        id,
        Field::IoPriority,
        plugin,
        &mut out.io_priority,
        l.io_priority,
    )?;
    claim_set(
        o,
        id,
        Field::SeccompPolicy,
        plugin,
        &mut out.seccomp_policy,
        l.seccomp_policy,
    )?;
    let ns = l.namespaces;
    merge_list(
        o,
        id,
        Field::Namespace,
        plugin,
        &mut out.namespaces,
        ns,
        namespace_key,
    )?;
    merge_map(o, id, Field::Sysctl, plugin, &mut out.sysctl, l.sysctl)?;
    merge_map(
        o,
        id,
        Field::LinuxNetDevices,
        plugin,
        &mut out.net_devices,
        l.net_devices,
    )?;
    claim_set(
        o,
        id,
        Field::LinuxSched,
        plugin,
        &mut out.scheduler,
        l.scheduler,
    )?;
    if let Some(rdt) = l.rdt {
        merge_rdt(o, id, plugin, &mut out.rdt, rdt)?;
    }
    claim_set(
        o,
        id,
        Field::MemoryPolicy,
        plugin,
        &mut out.memory_policy,
        l.memory_policy,
    )
}

/// Claims a whole-value field and sets it, if the plugin set it.
fn claim_set<T>(
    o: &mut Owners,
    id: &str,
    field: Field,
    plugin: &str,
    out: &mut Option<T>,
    v: Option<T>,
) -> Result<(), MergeError> {
    if v.is_some() {
        o.claim(id, field, None, plugin)?;
        *out = v;
    }
    Ok(())
}

fn merge_rdt(
    o: &mut Owners,
    id: &str,
    plugin: &str,
    out: &mut Option<api::LinuxRdt>,
    rdt: api::LinuxRdt,
) -> Result<(), MergeError> {
    let parts = [
        Field::RdtClosId,
        Field::RdtSchemata,
        Field::RdtEnableMonitoring,
    ];
    if rdt.remove {
        for f in parts {
            o.remove(id, f, None, plugin);
        }
        *out = Some(api::LinuxRdt {
            remove: true,
            ..Default::default()
        });
    }
    let claims: Vec<Claim> = [
        rdt.clos_id.is_some(),
        rdt.schemata.is_some(),
        rdt.enable_monitoring.is_some(),
    ]
    .into_iter()
    .zip(parts)
    .filter_map(|(set, f)| set.then_some((f, None)))
    .collect();
    if claims.is_empty() {
        return Ok(());
    }
    o.claim_all(id, &claims, plugin)?;
    let t = out.get_or_insert_default();
    // Setting anything overrides an earlier removal: the spec gets the settings.
    t.remove = false;
    set(&mut t.clos_id, rdt.clos_id);
    set(&mut t.schemata, rdt.schemata);
    set(&mut t.enable_monitoring, rdt.enable_monitoring);
    Ok(())
}

fn set<T>(to: &mut Option<T>, v: Option<T>) {
    if v.is_some() {
        *to = v;
    }
}

/// The fields of a container's resources a plugin's `r` claims.
fn resource_claims(r: &api::LinuxResources) -> Vec<Claim> {
    let mut c: Vec<Claim> = Vec::new();
    let mut simple = |set: bool, f: Field| {
        if set {
            c.push((f, None));
        }
    };
    if let Some(m) = &r.memory {
        simple(m.limit.is_some(), Field::MemLimit);
        simple(m.reservation.is_some(), Field::MemReservation);
        simple(m.swap.is_some(), Field::MemSwapLimit);
        simple(m.kernel.is_some(), Field::MemKernelLimit);
        simple(m.kernel_tcp.is_some(), Field::MemTcpLimit);
        simple(m.swappiness.is_some(), Field::MemSwappiness);
        simple(m.disable_oom_killer.is_some(), Field::MemDisableOomKiller);
        simple(m.use_hierarchy.is_some(), Field::MemUseHierarchy);
    }
    if let Some(cpu) = &r.cpu {
        simple(cpu.shares.is_some(), Field::CpuShares);
        simple(cpu.quota.is_some(), Field::CpuQuota);
        simple(cpu.period.is_some(), Field::CpuPeriod);
        simple(cpu.realtime_runtime.is_some(), Field::CpuRealtimeRuntime);
        simple(cpu.realtime_period.is_some(), Field::CpuRealtimePeriod);
        simple(!cpu.cpus.is_empty(), Field::CpuSetCpUs);
        simple(!cpu.mems.is_empty(), Field::CpuSetMems);
    }
    simple(r.blockio_class.is_some(), Field::BlockioClass);
    simple(r.rdt_class.is_some(), Field::RdtClass);
    simple(r.pids.is_some(), Field::PidsLimit);
    for h in &r.hugepage_limits {
        c.push((Field::HugepageLimits, Some(h.page_size.clone())));
    }
    // Sorted, so that of several conflicts the same one is reported every time.
    let mut unified: Vec<&String> = r.unified.keys().collect();
    unified.sort();
    c.extend(
        unified
            .into_iter()
            .map(|k| (Field::CgroupsUnified, Some(k.clone()))),
    );
    c
}

/// Sets in `to` what `r` sets; `devices`: whether device cgroup rules are taken (appended).
fn merge_resources(to: &mut api::LinuxResources, r: api::LinuxResources, devices: bool) {
    if let Some(m) = r.memory {
        let t = to.memory.get_or_insert_default();
        set(&mut t.limit, m.limit);
        set(&mut t.reservation, m.reservation);
        set(&mut t.swap, m.swap);
        set(&mut t.kernel, m.kernel);
        set(&mut t.kernel_tcp, m.kernel_tcp);
        set(&mut t.swappiness, m.swappiness);
        set(&mut t.disable_oom_killer, m.disable_oom_killer);
        set(&mut t.use_hierarchy, m.use_hierarchy);
    }
    if let Some(c) = r.cpu {
        let t = to.cpu.get_or_insert_default();
        set(&mut t.shares, c.shares);
        set(&mut t.quota, c.quota);
        set(&mut t.period, c.period);
        set(&mut t.realtime_runtime, c.realtime_runtime);
        set(&mut t.realtime_period, c.realtime_period);
        if !c.cpus.is_empty() {
            t.cpus = c.cpus;
        }
        if !c.mems.is_empty() {
            t.mems = c.mems;
        }
    }
    for h in r.hugepage_limits {
        to.hugepage_limits.retain(|x| x.page_size != h.page_size);
        to.hugepage_limits.push(h);
    }
    to.unified.extend(r.unified);
    if devices {
        to.devices.extend(r.devices);
    }
    set(&mut to.blockio_class, r.blockio_class);
    set(&mut to.rdt_class, r.rdt_class);
    set(&mut to.pids, r.pids);
}

/// A field of a container, and its key for the fields that have one per key.
type Claim = (Field, Option<String>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Owner {
    Set(String),
    Removed(String),
}

/// Which plugin owns which field of which container.
#[derive(Debug)]
struct Owners {
    /// The container being created.
    created: String,
    fields: HashMap<(String, Field, Option<String>), Owner>,
    /// The plugins that added hooks, in order: hooks accumulate, no one owns them.
    hooks: Vec<String>,
}

impl Owners {
    fn new(created: &str) -> Self {
        Owners {
            created: created.to_string(),
            fields: HashMap::new(),
            hooks: Vec::new(),
        }
    }

    fn entry(id: &str, field: Field, key: Option<&str>) -> (String, Field, Option<String>) {
        (id.to_string(), field, key.map(str::to_string))
    }

    /// The conflict `plugin` setting the field would be: with whoever set or removed it.
    fn conflict(
        &self,
        id: &str,
        field: Field,
        key: Option<&str>,
        plugin: &str,
    ) -> Option<MergeError> {
        let other = match self.fields.get(&Self::entry(id, field, key))? {
            Owner::Set(p) | Owner::Removed(p) if p != plugin => p,
            _ => return None,
        };
        let mut what = describe(field, key);
        if id != self.created {
            what = format!("{what} of container {}", show(id));
        }
        Some(MergeError::Conflict {
            what,
            first: other.clone(),
            second: plugin.to_string(),
        })
    }

    fn claim(
        &mut self,
        id: &str,
        field: Field,
        key: Option<&str>,
        plugin: &str,
    ) -> Result<(), MergeError> {
        if let Some(e) = self.conflict(id, field, key, plugin) {
            return Err(e);
        }
        self.fields
            .insert(Self::entry(id, field, key), Owner::Set(plugin.to_string()));
        Ok(())
    }

    /// Claims all of `claims`, or none of them.
    fn claim_all(&mut self, id: &str, claims: &[Claim], plugin: &str) -> Result<(), MergeError> {
        if let Some(e) = claims
            .iter()
            .find_map(|(f, k)| self.conflict(id, *f, k.as_deref(), plugin))
        {
            return Err(e);
        }
        for (f, k) in claims {
            self.claim(id, *f, k.as_deref(), plugin)?;
        }
        Ok(())
    }

    fn remove(&mut self, id: &str, field: Field, key: Option<&str>, plugin: &str) {
        self.fields.insert(
            Self::entry(id, field, key),
            Owner::Removed(plugin.to_string()),
        );
    }

    fn into_api(self) -> api::OwningPlugins {
        let mut out = api::OwningPlugins::default();
        for ((id, field, key), owner) in self.fields {
            let plugin = match owner {
                Owner::Set(p) => p,
                Owner::Removed(p) => format!("-{p}"),
            };
            let f = out.owners.entry(id).or_default();
            match key {
                None => {
                    f.simple.insert(field as i32, plugin);
                }
                Some(k) => {
                    f.compound
                        .entry(field as i32)
                        .or_default()
                        .owners
                        .insert(k, plugin);
                }
            }
        }
        if !self.hooks.is_empty() {
            let f = out.owners.entry(self.created).or_default();
            f.simple
                .insert(Field::OciHooks as i32, self.hooks.join(","));
        }
        out
    }
}

/// A field, for a person: "environment variable FOO", "memory limit".
fn describe(field: Field, key: Option<&str>) -> String {
    let name = match field {
        Field::None => "nothing",
        Field::Annotations => "annotation",
        Field::Mounts => "mount",
        Field::OciHooks => "hooks",
        Field::Devices => "device",
        Field::CdiDevices => "CDI device",
        Field::Env => "environment variable",
        Field::Args => "arguments",
        Field::MemLimit => "memory limit",
        Field::MemReservation => "memory reservation",
        Field::MemSwapLimit => "memory+swap limit",
        Field::MemKernelLimit => "kernel memory limit",
        Field::MemTcpLimit => "kernel TCP memory limit",
        Field::MemSwappiness => "memory swappiness",
        Field::MemDisableOomKiller => "OOM killer switch",
        Field::MemUseHierarchy => "memory hierarchy switch",
        Field::CpuShares => "CPU shares",
        Field::CpuQuota => "CPU quota",
        Field::CpuPeriod => "CPU period",
        Field::CpuRealtimeRuntime => "CPU realtime runtime",
        Field::CpuRealtimePeriod => "CPU realtime period",
        Field::CpuSetCpUs => "cpuset CPUs",
        Field::CpuSetMems => "cpuset memory nodes",
        Field::PidsLimit => "pids limit",
        Field::HugepageLimits => "hugepage limit",
        Field::BlockioClass => "blockio class",
        Field::RdtClass => "RDT class",
        Field::CgroupsUnified => "unified cgroup setting",
        Field::CgroupsPath => "cgroups path",
        Field::OomScoreAdj => "OOM score adjustment",
        Field::Rlimits => "rlimit",
        Field::IoPriority => "I/O priority",
        Field::SeccompPolicy => "seccomp policy",
        Field::Namespace => "namespace",
        Field::Sysctl => "sysctl",
        Field::LinuxNetDevices => "network device",
        Field::LinuxSched => "scheduling policy",
        Field::RdtClosId => "RDT CLOS id",
        Field::RdtSchemata => "RDT schemata",
        Field::RdtEnableMonitoring => "RDT monitoring switch",
        Field::MemoryPolicy => "memory policy",
    };
    match key {
        // Plain keys as they are, anything odd quoted and shortened.
        Some(k) if k.len() <= 64 && k.bytes().all(|b| b.is_ascii_graphic()) => {
            format!("{name} {k}")
        }
        Some(k) => format!("{name} {}", show(k)),
        None => name.to_string(),
    }
}

#[cfg(test)]
mod tests;
