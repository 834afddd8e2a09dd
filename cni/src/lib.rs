//! A CNI runtime (the part of libcni a container runtime needs): it finds the network config,
//! runs the standard plugin binaries per the CNI spec (1.0.0, and 0.4.0 / 0.3.x lists) and
//! caches ADD results for DEL.
//!
//! - Config: the first file, by name, in `conf_dir` ending in `.conflist`, `.conf` or
//!   `.json` that loads (a `.conf` is a single plugin config, wrapped as a one-plugin list;
//!   files that do not load are skipped with a warning). The directory is read again on every
//!   call, so a config that appears later is used without a restart ([`Cni::ready`]).
//! - Plugins: `bin_dirs` are searched in order; a plugin runs with its config on stdin and
//!   `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS`, `CNI_PATH`,
//!   `PATH` and `GOMAXPROCS=1` ([`exec::PLUGIN_GOMAXPROCS`]) as its whole environment, under
//!   `timeout` (killed when it runs out).
//! - [`Cni::setup`] (ADD) runs the plugins in order, chaining `prevResult`; when one fails, DEL
//!   is run for the whole list and the plugin's error returned. [`Cni::teardown`] (DEL) runs
//!   all of them in reverse, with the config and `prevResult` cached by ADD, even when some
//!   fail; it succeeds when the netns is already gone (`CNI_NETNS` is then empty).
//! - Cache: an entry per pod in `<cache_dir>/journal` (see [`cache`]), removed after a successful DEL.
//! - [`netns`]: pinning a network namespace to a file.

pub mod cache;
pub mod config;
mod error;
mod exec;
pub mod netns;
pub mod pidfd;
pub mod result;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use config::NetworkList;
pub use error::CniError;
pub use result::{Interface, IpConfig, NetworkResult};

use cache::CacheEntry;
use exec::{Exec, Invocation};

/// Where configs, plugins and cached results are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniConfig {
    /// Network configs (default `/etc/cni/net.d`).
    pub conf_dir: PathBuf,
    /// Plugin binaries, searched in order (default `/opt/cni/bin`, `/usr/lib/cni`).
    pub bin_dirs: Vec<PathBuf>,
    /// Cached ADD results, in a journal (e.g. `<root_dir>/cni-cache`).
    pub cache_dir: PathBuf,
    /// The limit for one plugin call.
    pub timeout: Duration,
}

impl CniConfig {
    /// The default per-plugin timeout.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

    /// A config with the default timeout.
    pub fn new(conf_dir: PathBuf, bin_dirs: Vec<PathBuf>, cache_dir: PathBuf) -> Self {
        CniConfig {
            conf_dir,
            bin_dirs,
            cache_dir,
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }
}

/// A `portMappings` capability entry (CRI `PortMapping`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PortMapping {
    /// Mappings with a host port of 0 or less are not passed to plugins.
    pub host_port: i32,
    pub container_port: i32,
    /// `tcp`, `udp` or `sctp` (any case; passed lowercased; empty: `tcp`).
    pub protocol: String,
    /// Empty: all host addresses.
    pub host_ip: String,
}

/// The `dns` capability (the pod's DNS config).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Dns {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// One pod's attachment to the network.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodNetwork {
    /// The sandbox id: `CNI_CONTAINERID`, `K8S_POD_INFRA_CONTAINER_ID` and the cache file
    /// name (so it must be a plain file name).
    pub id: String,
    /// The network namespace file (`CNI_NETNS`).
    pub netns: PathBuf,
    /// The interface in the pod (`CNI_IFNAME`); empty means `eth0`.
    pub ifname: String,
    /// Pod name, namespace and UID, for `CNI_ARGS`.
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub port_mappings: Vec<PortMapping>,
    pub dns: Option<Dns>,
    /// Further capability args (e.g. `bandwidth`, `io.kubernetes.cri.pod-annotations`),
    /// given to plugins that declare them.
    pub capability_args: BTreeMap<String, Value>,
}

impl PodNetwork {
    /// The interface name, `eth0` when none is set.
    pub fn ifname(&self) -> &str {
        if self.ifname.is_empty() {
            "eth0"
        } else {
            &self.ifname
        }
    }

    /// `CNI_ARGS`.
    pub fn cni_args(&self) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            self.namespace, self.name, self.id, self.uid
        )
    }

    /// The capability args plugins may get in `runtimeConfig`: `portMappings` (when there is
    /// one with a host port), `dns` (when set) and [`PodNetwork::capability_args`].
    pub fn runtime_capabilities(&self) -> BTreeMap<String, Value> {
        let mut caps = self.capability_args.clone();
        let ports: Vec<Value> = self
            .port_mappings
            .iter()
            .filter(|p| p.host_port > 0)
            .map(|p| {
                let protocol = if p.protocol.is_empty() {
                    "tcp".to_string()
                } else {
                    p.protocol.to_ascii_lowercase()
                };
                let mut v = json!({
                    "hostPort": p.host_port,
                    "containerPort": p.container_port,
                    "protocol": protocol,
                });
                if !p.host_ip.is_empty() {
                    v["hostIP"] = Value::String(p.host_ip.clone());
                }
                v
            })
            .collect();
        if !ports.is_empty() {
            caps.insert("portMappings".into(), Value::Array(ports));
        }
        if let Some(dns) = &self.dns {
            caps.insert(
                "dns".into(),
                json!({"servers": dns.servers, "searches": dns.searches, "options": dns.options}),
            );
        }
        caps
    }
}

/// The CNI runtime; cheap to share (`&self` everywhere, no interior state but the files).
#[derive(Debug, Clone)]
pub struct Cni {
    config: CniConfig,
    exec: Exec,
    cache: cache::Cache,
}

/// Everything one ADD/DEL/CHECK pass over a list needs.
struct Pass<'a> {
    list: &'a NetworkList,
    container_id: &'a str,
    netns: &'a str,
    ifname: &'a str,
    args: &'a str,
    caps: &'a BTreeMap<String, Value>,
}

impl Cni {
    pub fn new(config: CniConfig) -> Self {
        let exec = Exec::new(config.bin_dirs.clone(), config.timeout);
        let cache = cache::Cache::new(config.cache_dir.clone());
        Cni {
            config,
            exec,
            cache,
        }
    }

    /// The result cache, for tests that look at what ADD left there.
    #[cfg(test)]
    pub(crate) fn cache(&self) -> &cache::Cache {
        &self.cache
    }

    pub fn config(&self) -> &CniConfig {
        &self.config
    }

    /// The network config in use now (read from the conf dir).
    pub fn network(&self) -> Result<NetworkList, CniError> {
        config::discover(&self.config.conf_dir).map_err(CniError::NoConfig)
    }

    /// Ok when there is a network config and all its plugins are installed; else the reason.
    pub fn ready(&self) -> Result<(), String> {
        let list = config::discover(&self.config.conf_dir)?;
        for i in 0..list.plugins.len() {
            self.exec
                .find(list.plugin_type(i))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The result cached by a successful [`Cni::setup`] of pod `id`, if any (e.g. to report the
    /// pod IP after a daemon restart).
    pub fn cached_result(&self, id: &str) -> Result<Option<NetworkResult>, CniError> {
        check_id(id)?;
        let Some(entry) = self.cache.load(id).map_err(CniError::Io)? else {
            return Ok(None);
        };
        match entry.result {
            None => Ok(None),
            Some(raw) => NetworkResult::parse(raw, &entry.if_name)
                .map(Some)
                .map_err(CniError::BadResult),
        }
    }

    /// ADD: attaches the pod's netns to the network. On failure everything is undone (DEL for
    /// the whole list) and the error names the failing plugin; if the undo fails too, the
    /// cache entry stays so that [`Cni::teardown`] can retry it.
    pub async fn setup(&self, req: &PodNetwork) -> Result<NetworkResult, CniError> {
        check_id(&req.id)?;
        if req.netns.as_os_str().is_empty() {
            return Err(CniError::InvalidRequest("no network namespace".into()));
        }
        let list = self.network()?;
        let mut binaries = Vec::with_capacity(list.plugins.len());
        for i in 0..list.plugins.len() {
            binaries.push(self.exec.find(list.plugin_type(i))?);
        }
        let netns = req.netns.to_string_lossy();
        let caps = req.runtime_capabilities();
        let args = req.cni_args();
        let mut entry = CacheEntry {
            kind: cache::CACHE_KIND.into(),
            container_id: req.id.clone(),
            if_name: req.ifname().to_string(),
            netns: netns.to_string(),
            cni_args: args.clone(),
            capability_args: caps.clone(),
            config_path: list.source.clone(),
            config: list.to_json(),
            result: None,
        };
        self.store(&entry)?;
        let pass = Pass {
            list: &list,
            container_id: &req.id,
            netns: &netns,
            ifname: req.ifname(),
            args: &args,
            caps: &caps,
        };
        tracing::info!(pod = %req.id, network = %list.name, netns = %netns, "CNI ADD");
        let mut prev: Option<Value> = None;
        let mut failure = None;
        for (i, binary) in binaries.iter().enumerate() {
            let plugin = list.plugin_type(i);
            let conf = config::plugin_config(&list, i, prev.as_ref(), &caps);
            let out = match self
                .exec
                .run(plugin, binary, &conf, &pass.invocation("ADD"))
                .await
            {
                Ok(out) => out,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            if out.iter().all(u8::is_ascii_whitespace) {
                // Nothing printed: the previous result stands.
                continue;
            }
            match serde_json::from_slice::<Value>(&out) {
                Ok(v) if v.is_object() => prev = Some(v),
                _ => {
                    failure = Some(CniError::BadResult(format!(
                        "plugin {plugin} printed {:?}",
                        String::from_utf8_lossy(&out)
                    )));
                    break;
                }
            }
        }
        let outcome = match (failure, prev.clone()) {
            (Some(e), _) => Err(e),
            (None, None) => Err(CniError::BadResult(format!(
                "network {} gave no result",
                list.name
            ))),
            (None, Some(raw)) => {
                NetworkResult::parse(raw, req.ifname()).map_err(CniError::BadResult)
            }
        };
        let outcome = match outcome {
            Ok(result) => {
                entry.result = Some(result.raw.clone());
                self.store(&entry).map(|()| result)
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(result) => {
                tracing::info!(pod = %req.id, ips = ?result.ips, "CNI ADD done");
                Ok(result)
            }
            Err(e) => {
                tracing::warn!(pod = %req.id, "CNI ADD failed, undoing it: {e}");
                let prev = prev.filter(|_| list.has_cached_results());
                match CniError::from_many(self.del_all(&pass, prev.as_ref()).await) {
                    Ok(()) => {
                        if let Err(err) = self.cache.remove(&req.id) {
                            tracing::warn!(pod = %req.id, "removing CNI cache entry: {err}");
                        }
                    }
                    Err(undo) => {
                        tracing::warn!(pod = %req.id, "undoing the failed CNI ADD failed: {undo}")
                    }
                }
                Err(e)
            }
        }
    }

    /// DEL: detaches the pod, running every plugin in reverse order with the config (and
    /// interface, CNI_ARGS and capability args) that ADD used, from the cache, or with the
    /// current config when nothing is cached. All plugins are run even when some fail; the
    /// errors are returned together and the cache entry kept for a retry. A missing netns (or
    /// a path that is no longer a namespace) is passed as an empty `CNI_NETNS`. With neither
    /// a cache entry nor a config this is [`CniError::NoConfig`] (nothing could be run).
    pub async fn teardown(&self, req: &PodNetwork) -> Result<(), CniError> {
        check_id(&req.id)?;
        let entry = match self.cache.load(&req.id) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(pod = %req.id, "ignoring the CNI cache entry: {e}");
                None
            }
        };
        let cached = entry.and_then(|e| {
            match NetworkList::from_list_json(e.config.clone(), e.config_path.clone()) {
                Ok(list) => Some((e, list)),
                Err(err) => {
                    tracing::warn!(pod = %req.id, "ignoring the cached CNI config: {err}");
                    None
                }
            }
        });
        let mut netns_path = req.netns.clone();
        let (list, ifname, args, caps, prev) = match cached {
            Some((e, list)) => {
                if netns_path.as_os_str().is_empty() {
                    netns_path = PathBuf::from(&e.netns);
                }
                let prev = e.result.filter(|_| list.has_cached_results());
                (list, e.if_name, e.cni_args, e.capability_args, prev)
            }
            None => (
                self.network()?,
                req.ifname().to_string(),
                req.cni_args(),
                req.runtime_capabilities(),
                None,
            ),
        };
        let netns = if !netns_path.as_os_str().is_empty() && netns::is_netns(&netns_path) {
            netns_path.to_string_lossy().into_owned()
        } else {
            String::new()
        };
        let pass = Pass {
            list: &list,
            container_id: &req.id,
            netns: &netns,
            ifname: &ifname,
            args: &args,
            caps: &caps,
        };
        tracing::info!(pod = %req.id, network = %list.name, netns = %netns, "CNI DEL");
        CniError::from_many(self.del_all(&pass, prev.as_ref()).await)?;
        self.cache
            .remove(&req.id)
            .map_err(|e| CniError::Io(format!("removing the CNI cache entry of {}: {e}", req.id)))
    }

    /// CHECK (spec >= 0.4.0): runs every plugin with the cached result as `prevResult`.
    /// Skipped (Ok) for older lists and `disableCheck`; an error when nothing is cached.
    pub async fn check(&self, req: &PodNetwork) -> Result<(), CniError> {
        check_id(&req.id)?;
        let entry = self.cache.load(&req.id).map_err(CniError::Io)?;
        let Some((entry, prev)) = entry.and_then(|e| e.result.clone().map(|r| (e, r))) else {
            return Err(CniError::InvalidRequest(format!(
                "no cached CNI result for {}",
                req.id
            )));
        };
        let list = NetworkList::from_list_json(entry.config, entry.config_path)
            .map_err(CniError::BadResult)?;
        if list.disable_check || !list.has_cached_results() {
            return Ok(());
        }
        let netns = req.netns.to_string_lossy();
        let pass = Pass {
            list: &list,
            container_id: &req.id,
            netns: &netns,
            ifname: &entry.if_name,
            args: &entry.cni_args,
            caps: &entry.capability_args,
        };
        for i in 0..list.plugins.len() {
            let plugin = list.plugin_type(i);
            let binary = self.exec.find(plugin)?;
            let conf = config::plugin_config(&list, i, Some(&prev), pass.caps);
            self.exec
                .run(plugin, &binary, &conf, &pass.invocation("CHECK"))
                .await?;
        }
        Ok(())
    }

    /// DEL for every plugin of the list, last first; the errors of those that failed.
    async fn del_all(&self, pass: &Pass<'_>, prev: Option<&Value>) -> Vec<CniError> {
        let mut errors = Vec::new();
        for i in (0..pass.list.plugins.len()).rev() {
            let plugin = pass.list.plugin_type(i);
            let binary = match self.exec.find(plugin) {
                Ok(b) => b,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let conf = config::plugin_config(pass.list, i, prev, pass.caps);
            if let Err(e) = self
                .exec
                .run(plugin, &binary, &conf, &pass.invocation("DEL"))
                .await
            {
                tracing::warn!(pod = %pass.container_id, "{e}");
                errors.push(e);
            }
        }
        errors
    }

    fn store(&self, entry: &CacheEntry) -> Result<(), CniError> {
        crishim_sys::blocking::off_the_workers(|| self.cache.store(entry)).map_err(|e| {
            CniError::Io(format!(
                "writing the CNI cache entry in {}: {e}",
                self.config.cache_dir.display()
            ))
        })
    }
}

impl Pass<'_> {
    fn invocation<'a>(&'a self, command: &'a str) -> Invocation<'a> {
        Invocation {
            command,
            container_id: self.container_id,
            netns: self.netns,
            ifname: self.ifname,
            args: self.args,
        }
    }
}

/// Pod ids name cache files: a plain, non-empty file name.
fn check_id(id: &str) -> Result<(), CniError> {
    let bad = id.is_empty()
        || id == "."
        || id == ".."
        || id.starts_with('.')
        || id.contains('/')
        || id.contains('\0')
        || Path::new(id).components().count() != 1;
    if bad {
        return Err(CniError::InvalidRequest(format!("invalid pod id {id:?}")));
    }
    Ok(())
}
