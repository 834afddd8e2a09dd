//! The test plugin's configuration (JSON; every key optional, unknown keys refused so that a
//! test's typo fails loudly), and the NRI messages it turns into.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use crishim_nri::api;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The events a plugin subscribes to, by RPC name.
pub const EVENTS: [(&str, api::Event); 14] = [
    ("RunPodSandbox", api::Event::RunPodSandbox),
    ("StopPodSandbox", api::Event::StopPodSandbox),
    ("RemovePodSandbox", api::Event::RemovePodSandbox),
    ("CreateContainer", api::Event::CreateContainer),
    ("PostCreateContainer", api::Event::PostCreateContainer),
    ("StartContainer", api::Event::StartContainer),
    ("PostStartContainer", api::Event::PostStartContainer),
    ("UpdateContainer", api::Event::UpdateContainer),
    ("PostUpdateContainer", api::Event::PostUpdateContainer),
    ("StopContainer", api::Event::StopContainer),
    ("RemoveContainer", api::Event::RemoveContainer),
    ("UpdatePodSandbox", api::Event::UpdatePodSandbox),
    ("PostUpdatePodSandbox", api::Event::PostUpdatePodSandbox),
    (
        "ValidateContainerAdjustment",
        api::Event::ValidateContainerAdjustment,
    ),
];

/// RPCs that are not events but may still trigger a hostile mode.
const OTHER_RPCS: [&str; 3] = ["Configure", "Synchronize", "Shutdown"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where to append one line per event.
    pub log: Option<PathBuf>,
    /// The events to subscribe to, by RPC name; all when absent.
    pub events: Option<Vec<String>>,
    /// The only container name adjusted, updated or met with a hostile mode; all when absent.
    #[serde(rename = "match")]
    pub match_name: Option<String>,
    pub adjust: Option<Adjust>,
    /// Resources to answer UpdateContainer with, for the container being updated.
    pub update_on_update: Option<Resources>,
    pub unsolicited_update: Option<Unsolicited>,
    #[serde(default)]
    pub mode: Mode,
    /// The RPC at which a hostile mode strikes.
    #[serde(default = "default_mode_event")]
    pub mode_event: String,
}

fn default_mode_event() -> String {
    "CreateContainer".into()
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    Normal,
    /// Never answers.
    Hang,
    /// Exits (code 1) without answering.
    Crash,
    /// Sends a reply over ttrpc's size limit.
    Flood,
    /// Sends bytes that are no valid ttrpc message.
    Nonsense,
    /// Connects and never registers.
    NoRegister,
    /// Registers after 10 s.
    SlowRegister,
    /// Closes the connection instead of answering.
    Disconnect,
}

impl Config {
    pub fn parse(text: &str) -> Result<Config> {
        let config: Config = serde_json::from_str(text).context("parsing the configuration")?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<()> {
        for name in self.events.iter().flatten() {
            event(name)?;
        }
        check_rpc(&self.mode_event)?;
        if let Some(u) = &self.unsolicited_update {
            check_rpc(&u.after_event)?;
        }
        Ok(())
    }

    /// The event mask Configure answers with: 0, all, unless `events` names some.
    pub fn event_mask(&self) -> i32 {
        let Some(names) = &self.events else {
            return 0;
        };
        let events: Vec<_> = names.iter().filter_map(|n| event(n).ok()).collect();
        api::EventMask::of(&events).0
    }

    /// Whether a container by this name is the plugin's to adjust (`None`: a pod's event).
    pub fn matches(&self, container: Option<&str>) -> bool {
        match (&self.match_name, container) {
            (Some(want), Some(name)) => want == name,
            _ => true,
        }
    }
}

fn event(name: &str) -> Result<api::Event> {
    match EVENTS.iter().find(|(n, _)| *n == name) {
        Some((_, e)) => Ok(*e),
        None => bail!("unknown event {name:?}"),
    }
}

fn check_rpc(name: &str) -> Result<()> {
    if OTHER_RPCS.contains(&name) {
        return Ok(());
    }
    event(name).map(|_| ())
}

/// Linux resources, as adjustments and updates carry them.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    pub memory_limit: Option<i64>,
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub cpuset_cpus: Option<String>,
    pub cpuset_mems: Option<String>,
    pub pids_limit: Option<i64>,
}

/// The keys of [`Resources`], which other objects share their level with.
const RESOURCE_KEYS: [&str; 7] = [
    "memory_limit",
    "cpu_shares",
    "cpu_quota",
    "cpu_period",
    "cpuset_cpus",
    "cpuset_mems",
    "pids_limit",
];

/// An object whose resource keys go to [`Resources`] and the rest to `T`, both refusing keys
/// they do not know (serde's `flatten` cannot refuse them).
fn split<T: DeserializeOwned>(mut map: Map<String, Value>) -> Result<(T, Resources), String> {
    let resources: Map<String, Value> = RESOURCE_KEYS
        .iter()
        .filter_map(|k| map.remove_entry(*k))
        .collect();
    let rest = serde_json::from_value(Value::Object(map)).map_err(|e| e.to_string())?;
    let resources = serde_json::from_value(Value::Object(resources)).map_err(|e| e.to_string())?;
    Ok((rest, resources))
}

impl Resources {
    pub fn to_api(&self) -> Option<api::LinuxResources> {
        let memory = self.memory_limit.map(|limit| api::LinuxMemory {
            limit: Some(api::OptionalInt64 { value: limit }),
            ..Default::default()
        });
        let cpu = api::LinuxCpu {
            shares: self.cpu_shares.map(|value| api::OptionalUInt64 { value }),
            quota: self.cpu_quota.map(|value| api::OptionalInt64 { value }),
            period: self.cpu_period.map(|value| api::OptionalUInt64 { value }),
            cpus: self.cpuset_cpus.clone().unwrap_or_default(),
            mems: self.cpuset_mems.clone().unwrap_or_default(),
            ..Default::default()
        };
        let resources = api::LinuxResources {
            memory,
            cpu: (cpu != api::LinuxCpu::default()).then_some(cpu),
            pids: self.pids_limit.map(|limit| api::LinuxPids { limit }),
            ..Default::default()
        };
        (resources != api::LinuxResources::default()).then_some(resources)
    }

    /// An update of container `id` to these resources.
    pub fn update(&self, id: &str) -> api::ContainerUpdate {
        api::ContainerUpdate {
            container_id: id.to_string(),
            linux: Some(api::LinuxContainerUpdate {
                resources: self.to_api(),
            }),
            ignore_failure: false,
        }
    }
}

/// An UpdateContainers call the plugin makes on its own after an event.
#[derive(Debug, Deserialize)]
#[serde(try_from = "Map<String, Value>")]
pub struct Unsolicited {
    pub after_event: String,
    pub delay_ms: u64,
    /// Evict the container instead of updating it.
    pub evict: bool,
    pub resources: Resources,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UnsolicitedKeys {
    after_event: String,
    #[serde(default)]
    delay_ms: u64,
    #[serde(default)]
    evict: bool,
}

impl TryFrom<Map<String, Value>> for Unsolicited {
    type Error = String;

    fn try_from(map: Map<String, Value>) -> Result<Self, String> {
        let (keys, resources): (UnsolicitedKeys, _) = split(map)?;
        Ok(Unsolicited {
            after_event: keys.after_event,
            delay_ms: keys.delay_ms,
            evict: keys.evict,
            resources,
        })
    }
}

/// What CreateContainer adjusts.
#[derive(Debug, Deserialize)]
#[serde(try_from = "Map<String, Value>")]
pub struct Adjust {
    fields: AdjustFields,
    resources: Resources,
}

impl TryFrom<Map<String, Value>> for Adjust {
    type Error = String;

    fn try_from(map: Map<String, Value>) -> Result<Self, String> {
        let (fields, resources) = split(map)?;
        Ok(Adjust { fields, resources })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct AdjustFields {
    env: BTreeMap<String, String>,
    remove_env: Vec<String>,
    annotations: BTreeMap<String, String>,
    remove_annotations: Vec<String>,
    mounts: Vec<Mount>,
    remove_mounts: Vec<String>,
    hooks: Hooks,
    devices: Vec<Device>,
    cdi_devices: Vec<String>,
    rlimits: Vec<Rlimit>,
    oom_score_adj: Option<i64>,
    cgroups_path: Option<String>,
    args: Option<Vec<String>>,
    sysctl: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Mount {
    destination: String,
    source: String,
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    options: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Hooks {
    prestart: Vec<Hook>,
    create_runtime: Vec<Hook>,
    create_container: Vec<Hook>,
    start_container: Vec<Hook>,
    poststart: Vec<Hook>,
    poststop: Vec<Hook>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Hook {
    path: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<String>,
    timeout: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Device {
    path: String,
    #[serde(rename = "type")]
    kind: String,
    major: i64,
    minor: i64,
    file_mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rlimit {
    #[serde(rename = "type")]
    kind: String,
    hard: u64,
    soft: u64,
}

/// NRI marks an entry for removal with a leading '-'.
fn removal(key: &str) -> String {
    format!("-{key}")
}

impl Adjust {
    pub fn to_api(&self) -> api::ContainerAdjustment {
        let f = &self.fields;
        let hooks = |hooks: &[Hook]| -> Vec<api::Hook> {
            hooks
                .iter()
                .map(|h| api::Hook {
                    path: h.path.clone(),
                    args: h.args.clone(),
                    env: h.env.clone(),
                    timeout: h.timeout.map(|value| api::OptionalInt { value }),
                })
                .collect()
        };
        let all_hooks = api::Hooks {
            prestart: hooks(&f.hooks.prestart),
            create_runtime: hooks(&f.hooks.create_runtime),
            create_container: hooks(&f.hooks.create_container),
            start_container: hooks(&f.hooks.start_container),
            poststart: hooks(&f.hooks.poststart),
            poststop: hooks(&f.hooks.poststop),
        };
        let linux = api::LinuxContainerAdjustment {
            devices: f
                .devices
                .iter()
                .map(|d| api::LinuxDevice {
                    path: d.path.clone(),
                    r#type: d.kind.clone(),
                    major: d.major,
                    minor: d.minor,
                    file_mode: d.file_mode.map(|value| api::OptionalFileMode { value }),
                    uid: d.uid.map(|value| api::OptionalUInt32 { value }),
                    gid: d.gid.map(|value| api::OptionalUInt32 { value }),
                })
                .collect(),
            resources: self.resources.to_api(),
            cgroups_path: f.cgroups_path.clone().unwrap_or_default(),
            oom_score_adj: f.oom_score_adj.map(|value| api::OptionalInt { value }),
            sysctl: f.sysctl.clone().into_iter().collect(),
            ..Default::default()
        };
        let env = f.env.iter().map(|(k, v)| (k.clone(), v.clone()));
        let remove_env = f.remove_env.iter().map(|k| (removal(k), String::new()));
        let annotations = f.annotations.iter().map(|(k, v)| (k.clone(), v.clone()));
        let remove_annotations = f
            .remove_annotations
            .iter()
            .map(|k| (removal(k), String::new()));
        let mounts = f.mounts.iter().map(|m| api::Mount {
            destination: m.destination.clone(),
            r#type: m.kind.clone(),
            source: m.source.clone(),
            options: m.options.clone(),
        });
        let remove_mounts = f.remove_mounts.iter().map(|d| api::Mount {
            destination: removal(d),
            ..Default::default()
        });
        api::ContainerAdjustment {
            annotations: remove_annotations.chain(annotations).collect(),
            mounts: remove_mounts.chain(mounts).collect(),
            env: remove_env
                .chain(env)
                .map(|(key, value)| api::KeyValue { key, value })
                .collect(),
            hooks: (all_hooks != api::Hooks::default()).then_some(all_hooks),
            linux: (linux != api::LinuxContainerAdjustment::default()).then_some(linux),
            rlimits: f
                .rlimits
                .iter()
                .map(|r| api::PosixRlimit {
                    r#type: r.kind.clone(),
                    hard: r.hard,
                    soft: r.soft,
                })
                .collect(),
            cdi_devices: f
                .cdi_devices
                .iter()
                .map(|name| api::CdiDevice { name: name.clone() })
                .collect(),
            args: f.args.clone().unwrap_or_default(),
        }
    }
}
