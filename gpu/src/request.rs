//! What a container asks for: GPUs (CRI devices, `NVIDIA_VISIBLE_DEVICES`, CDI), driver
//! capabilities, and shared-GPU limits (annotations). Parsing only; [`super::Gpu::apply`]
//! resolves the request against the node.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use crishim_proto::cri;

use super::discover::{char_device_numbers, NVIDIA_MAJOR};
use super::error::GpuError;
use super::libraries::{parse_capabilities, Capability};

pub const ENV_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// The limits a device plugin may set in the container's env (crishim also sets them for the
/// interceptor).
pub const ENV_MEMORY_LIMIT: &str = "CRISHIM_VGPU_MEMORY_LIMIT";
pub const ENV_CORE_LIMIT: &str = "CRISHIM_VGPU_CORE_LIMIT";
/// The NVIDIA device plugin's volume-mounts strategy: a mount at `<this>/<index|uuid|all>`
/// (its host path is `/dev/null`) requests that GPU, and is not itself mounted.
pub const DEVICE_LIST_DIR: &str = "/var/run/nvidia-container-devices";
pub const ENV_DRIVER_CAPABILITIES: &str = "NVIDIA_DRIVER_CAPABILITIES";
pub const ANNOTATION_MEMORY: &str = "gpu.crishim.io/memory";
pub const ANNOTATION_CORES: &str = "gpu.crishim.io/cores";
pub const ANNOTATION_VCUDA_MEMORY: &str = "tencent.com/vcuda-memory";
pub const ANNOTATION_VCUDA_CORE: &str = "tencent.com/vcuda-core";
/// gpu-manager's memory unit.
const VCUDA_MEMORY_UNIT: u64 = 256 << 20;

/// A GPU named by `NVIDIA_VISIBLE_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ident {
    Index(u32),
    Uuid(String),
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// `NVIDIA_VISIBLE_DEVICES=all`.
    pub all: bool,
    /// `NVIDIA_VISIBLE_DEVICES=none`: the driver's libraries without devices.
    pub libraries_only: bool,
    /// GPUs named in `NVIDIA_VISIBLE_DEVICES`.
    pub named: Vec<Ident>,
    /// GPU nodes among the CRI devices: (host path, minor).
    pub nodes: Vec<(String, u32)>,
    /// Fully qualified CDI device names.
    pub cdi: Vec<String>,
    /// `NVIDIA_DRIVER_CAPABILITIES` (the container's, else the image's).
    pub capabilities: Option<String>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Bytes per GPU, and where it came from.
    pub memory: Option<Limit<u64>>,
    /// Percent of one GPU.
    pub cores: Option<Limit<u32>>,
}

impl Limits {
    pub fn any(&self) -> bool {
        self.memory.is_some() || self.cores.is_some()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit<T> {
    pub value: T,
    /// The annotation and its text, for messages.
    pub key: &'static str,
    pub text: String,
    /// Set on the container (else on the pod).
    pub on_container: bool,
}

impl Request {
    /// Whether any GPU or the driver is asked for by the container itself (CDI devices may be
    /// something else entirely; what they grant is seen when they are applied).
    pub fn wants_driver(&self) -> bool {
        self.all || self.libraries_only || !self.named.is_empty() || !self.nodes.is_empty()
    }

    /// The driver capabilities, read only once the container does get the driver: anything in
    /// the env of a container that does not is none of our business.
    pub fn capabilities(&self) -> Result<BTreeSet<Capability>, GpuError> {
        parse_capabilities(self.capabilities.as_deref().unwrap_or("")).map_err(GpuError::Invalid)
    }
}

/// Who may ask for GPUs and limits (`[gpu] accept_env_requests`, `limit_annotations`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub accept_env_requests: bool,
    pub limit_annotations: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            accept_env_requests: true,
            limit_annotations: true,
        }
    }
}

/// The only source a device-list mount may have: what the device plugin's volume-mounts
/// strategy sends, and all the NVIDIA toolkit honours.
pub const DEVICE_LIST_SOURCE: &str = "/dev/null";

/// The GPU a device-list mount requests (`None`: not such a mount). The path is taken lexically
/// (`//`, `.` and `..` resolved), so no spelling of it slips past the source check.
pub fn device_list_entry(container_path: &str) -> Option<String> {
    let cleaned = crishim_sys::path::clean(container_path);
    let entry = cleaned.strip_prefix(DEVICE_LIST_DIR)?.strip_prefix('/')?;
    (!entry.is_empty() && !entry.contains('/')).then(|| entry.to_string())
}

/// The GPU a CRI mount requests through the device-list strategy; `Ok(None)`: not such a mount.
/// Any source but [`DEVICE_LIST_SOURCE`] is refused: an emptyDir or hostPath at that path would
/// name GPUs without the device plugin.
pub fn device_list_request(m: &cri::Mount) -> Result<Option<String>, String> {
    let Some(entry) = device_list_entry(&m.container_path) else {
        return Ok(None);
    };
    if m.host_path != DEVICE_LIST_SOURCE {
        return Err(format!(
            "mount {:?} <- {:?}: a GPU device-list mount must have the source {DEVICE_LIST_SOURCE}, as the device plugin sends it",
            m.container_path, m.host_path
        ));
    }
    Ok(Some(entry))
}

/// Whether the container asks to be privileged.
pub fn is_privileged(config: &cri::ContainerConfig) -> bool {
    config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .is_some_and(|sc| sc.privileged)
}

/// Parse the GPU request of a container with `config`, from an image whose environment is
/// `image_env`. Limits are separate ([`limits`]): they only count for containers with GPUs.
pub fn parse(
    config: &cri::ContainerConfig,
    image_env: &[String],
    policy: Policy,
) -> Result<Request, GpuError> {
    let mut req = Request::default();
    // Only the container's own env selects GPUs: CUDA images set NVIDIA_VISIBLE_DEVICES=all in
    // their config, and honouring that would hand every GPU to any pod running one.
    let env = |key: &str| request_value(config, key);
    if let Some(v) = env(ENV_VISIBLE_DEVICES) {
        if policy.accept_env_requests || is_privileged(config) {
            parse_visible(&v, &mut req)?;
        }
    }
    for m in &config.mounts {
        if let Some(entry) = device_list_request(m).map_err(GpuError::Invalid)? {
            parse_visible(&entry, &mut req)?;
        }
    }
    for d in &config.devices {
        if let Ok(Some((NVIDIA_MAJOR, minor))) = char_device_numbers(Path::new(&d.host_path)) {
            if minor < 254 {
                req.nodes.push((d.host_path.clone(), minor));
            }
        }
    }
    req.cdi = config.cdi_devices.iter().map(|d| d.name.clone()).collect();
    let (_, annotated) =
        container_device_interface::annotations::parse_annotations(&config.annotations)
            .map_err(|e| GpuError::Invalid(format!("CDI annotations: {e}")))?;
    for name in annotated {
        if !req.cdi.contains(&name) {
            req.cdi.push(name);
        }
    }
    req.capabilities =
        env(ENV_DRIVER_CAPABILITIES).or_else(|| image_value(image_env, ENV_DRIVER_CAPABILITIES));
    Ok(req)
}

/// The limits: the annotations, the container's before the pod's, where the policy allows
/// them; else the device plugin's env.
pub fn limits(
    config: &cri::ContainerConfig,
    pod: &cri::PodSandboxConfig,
    policy: Policy,
) -> Result<Limits, GpuError> {
    if !policy.limit_annotations {
        return Ok(Limits {
            memory: env_limit(config, ENV_MEMORY_LIMIT, |k, t| {
                t.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|b| *b > 0)
                    .ok_or_else(|| format!("{k} {t:?}: expected a number of bytes"))
            })?,
            cores: env_limit(config, ENV_CORE_LIMIT, parse_cores)?,
        });
    }
    Ok(Limits {
        memory: limit(
            config,
            pod,
            &[ANNOTATION_MEMORY, ANNOTATION_VCUDA_MEMORY],
            parse_memory,
        )?,
        cores: limit(
            config,
            pod,
            &[ANNOTATION_CORES, ANNOTATION_VCUDA_CORE],
            parse_cores,
        )?,
    })
}

/// A limit the device plugin set in the container's env (its last value wins, as the kubelet
/// appends the plugin's env after the container's own).
fn env_limit<T>(
    config: &cri::ContainerConfig,
    key: &'static str,
    parse: fn(&str, &str) -> Result<T, String>,
) -> Result<Option<Limit<T>>, GpuError> {
    let Some(text) = request_value(config, key) else {
        return Ok(None);
    };
    let value = parse(key, &text).map_err(GpuError::Invalid)?;
    Ok(Some(Limit {
        value,
        key,
        text,
        on_container: true,
    }))
}

/// A limit annotation set on the container itself, if any (and if annotations count).
pub fn container_limit_key(config: &cri::ContainerConfig, policy: Policy) -> Option<&'static str> {
    if !policy.limit_annotations {
        return None;
    }
    [
        ANNOTATION_MEMORY,
        ANNOTATION_VCUDA_MEMORY,
        ANNOTATION_CORES,
        ANNOTATION_VCUDA_CORE,
    ]
    .into_iter()
    .find(|k| config.annotations.contains_key(*k))
}

/// The last value of `key` in the container's own env (the request's), bytes read as UTF-8.
pub fn request_value(config: &cri::ContainerConfig, key: &str) -> Option<String> {
    let kv = config.envs.iter().rev().find(|kv| kv.key == key)?;
    Some(String::from_utf8_lossy(&kv.value).into_owned())
}

/// The last value of `key` in an image's `KEY=value` list.
pub fn image_value(env: &[String], key: &str) -> Option<String> {
    env.iter().rev().find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.to_string())
    })
}

fn parse_visible(value: &str, req: &mut Request) -> Result<(), GpuError> {
    match value.trim() {
        "" | "void" => {}
        "none" => req.libraries_only = true,
        "all" => req.all = true,
        list => {
            for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let ident = if let Ok(i) = item.parse::<u32>() {
                    Ident::Index(i)
                } else if item.starts_with("GPU-") || item.starts_with("MIG-") {
                    Ident::Uuid(item.to_string())
                } else {
                    return Err(GpuError::Invalid(format!(
                        "{ENV_VISIBLE_DEVICES}: {item:?} is neither a GPU index nor a GPU or MIG UUID"
                    )));
                };
                req.named.push(ident);
            }
        }
    }
    Ok(())
}

/// The first of `keys` set on the container, else on the pod, parsed by `parse(key, text)`.
fn limit<T>(
    config: &cri::ContainerConfig,
    pod: &cri::PodSandboxConfig,
    keys: &[&'static str],
    parse: fn(&str, &str) -> Result<T, String>,
) -> Result<Option<Limit<T>>, GpuError> {
    let sources: [(&HashMap<String, String>, bool); 2] =
        [(&config.annotations, true), (&pod.annotations, false)];
    for (annotations, on_container) in sources {
        for key in keys {
            if let Some(text) = annotations.get(*key) {
                let value = parse(key, text).map_err(GpuError::Invalid)?;
                return Ok(Some(Limit {
                    value,
                    key,
                    text: text.clone(),
                    on_container,
                }));
            }
        }
    }
    Ok(None)
}

/// Bytes, or with a `Ki`/`Mi`/`Gi`/`Ti` suffix; gpu-manager's key counts 256 MiB units.
fn parse_memory(key: &str, text: &str) -> Result<u64, String> {
    let t = text.trim();
    let bad = |why: &str| format!("{key} {text:?}: {why}");
    let (digits, unit) = if key == ANNOTATION_VCUDA_MEMORY {
        (t, VCUDA_MEMORY_UNIT)
    } else {
        match t.find(|c: char| !c.is_ascii_digit()) {
            None => (t, 1),
            Some(i) => {
                let unit = match &t[i..] {
                    "Ki" => 1 << 10,
                    "Mi" => 1 << 20,
                    "Gi" => 1 << 30,
                    "Ti" => 1 << 40,
                    _ => {
                        return Err(bad(
                            "expected bytes, or a number with a Ki, Mi, Gi or Ti suffix",
                        ))
                    }
                };
                (&t[..i], unit)
            }
        }
    };
    let n: u64 = digits.parse().map_err(|_| bad("expected a whole number"))?;
    let bytes = n.checked_mul(unit).ok_or_else(|| bad("too large"))?;
    if bytes == 0 {
        return Err(bad("must be more than 0"));
    }
    Ok(bytes)
}

/// Percent of one GPU (gpu-manager's 100 is one GPU too).
fn parse_cores(key: &str, text: &str) -> Result<u32, String> {
    let n: u32 = text
        .trim()
        .parse()
        .map_err(|_| format!("{key} {text:?}: expected a whole percentage of one GPU"))?;
    if n == 0 {
        return Err(format!("{key} {text:?}: must be more than 0"));
    }
    Ok(n)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A container config with only these envs and annotations.
    pub(crate) fn config(
        env: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> cri::ContainerConfig {
        cri::ContainerConfig {
            envs: env
                .iter()
                .map(|(k, v)| cri::KeyValue {
                    key: k.to_string(),
                    value: v.to_string().into(),
                })
                .collect(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn parse_env(v: &str) -> Result<Request, GpuError> {
        parse(
            &config(&[(ENV_VISIBLE_DEVICES, v)], &[]),
            &[],
            Policy::default(),
        )
    }

    #[test]
    fn visible_devices_forms() {
        assert!(parse_env("all").unwrap().all);
        assert!(parse_env("none").unwrap().libraries_only);
        assert!(!parse_env("void").unwrap().wants_driver());
        assert!(!parse_env("").unwrap().wants_driver());
        assert_eq!(
            parse_env("1, GPU-abc").unwrap().named,
            vec![Ident::Index(1), Ident::Uuid("GPU-abc".into())]
        );
        assert_eq!(
            parse_env("0,MIG-x").unwrap().named,
            vec![Ident::Index(0), Ident::Uuid("MIG-x".into())]
        );
        let e = parse_env("0,gpu0").unwrap_err().to_string();
        assert!(e.contains("\"gpu0\""), "{e}");
    }

    #[test]
    fn the_image_env_does_not_select_gpus_but_widens_capabilities() {
        let image = vec![
            "NVIDIA_VISIBLE_DEVICES=all".to_string(),
            "NVIDIA_DRIVER_CAPABILITIES=video".to_string(),
        ];
        let r = parse(&config(&[], &[]), &image, Policy::default()).unwrap();
        assert!(!r.wants_driver());
        let caps = r.capabilities().unwrap();
        assert!(caps.contains(&Capability::Video));
        assert!(caps.contains(&Capability::Compute));
        // A capability this runtime does not know only matters to a container with the driver.
        let r = parse(
            &config(&[(ENV_DRIVER_CAPABILITIES, "teleport")], &[]),
            &image,
            Policy::default(),
        )
        .unwrap();
        assert!(r.capabilities().is_err());
    }

    #[test]
    fn limits_from_the_container_then_the_pod() {
        let pod = cri::PodSandboxConfig {
            annotations: [
                (ANNOTATION_MEMORY.to_string(), "1Gi".to_string()),
                (ANNOTATION_VCUDA_CORE.to_string(), "30".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        let l = limits(
            &config(&[], &[(ANNOTATION_MEMORY, "256Mi")]),
            &pod,
            Policy::default(),
        )
        .unwrap();
        let m = l.memory.unwrap();
        assert_eq!((m.value, m.on_container), (256 << 20, true));
        let c = l.cores.unwrap();
        assert_eq!(
            (c.value, c.key, c.on_container),
            (30, ANNOTATION_VCUDA_CORE, false)
        );
        let l = limits(
            &config(&[], &[(ANNOTATION_VCUDA_MEMORY, "3")]),
            &Default::default(),
            Policy::default(),
        )
        .unwrap();
        assert_eq!(l.memory.unwrap().value, 3 * (256 << 20));
        assert_eq!(
            container_limit_key(&config(&[], &[(ANNOTATION_CORES, "x")]), Policy::default()),
            Some(ANNOTATION_CORES)
        );
    }

    #[test]
    fn unprivileged_env_requests_can_be_refused_and_device_list_mounts_request_gpus() {
        let strict = Policy {
            accept_env_requests: false,
            limit_annotations: true,
        };
        let mut c = config(&[(ENV_VISIBLE_DEVICES, "all")], &[]);
        assert!(!parse(&c, &[], strict).unwrap().wants_driver());
        c.linux = Some(cri::LinuxContainerConfig {
            security_context: Some(cri::LinuxContainerSecurityContext {
                privileged: true,
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(
            parse(&c, &[], strict).unwrap().all,
            "privileged containers still may"
        );
        let mut c = config(&[], &[]);
        for path in [
            "/var/run/nvidia-container-devices/1",
            "/var/run/nvidia-container-devices/GPU-abc",
            "/var/run/nvidia-container-devices-not/2",
            "/var/run/nvidia-container-devices/3/deeper",
            "/var/run/nvidia-container-devices/",
        ] {
            c.mounts.push(cri::Mount {
                container_path: path.into(),
                host_path: "/dev/null".into(),
                ..Default::default()
            });
        }
        assert_eq!(
            parse(&c, &[], strict).unwrap().named,
            vec![Ident::Index(1), Ident::Uuid("GPU-abc".into())]
        );
        assert_eq!(
            device_list_entry("/var/run/nvidia-container-devices/all").as_deref(),
            Some("all")
        );
    }

    #[test]
    fn a_device_list_mount_with_any_source_but_dev_null_is_refused_in_every_spelling() {
        let strict = Policy {
            accept_env_requests: false,
            limit_annotations: true,
        };
        for path in [
            "/var/run/nvidia-container-devices/all",
            "//var/run/nvidia-container-devices//all",
            "/var/run/./nvidia-container-devices/all/",
            "/var/lib/../run/nvidia-container-devices/all",
        ] {
            for source in [
                "/var/lib/kubelet/pods/x/volumes/empty",
                "/dev/zero",
                "/dev/null/",
            ] {
                let mut c = config(&[], &[]);
                c.mounts.push(cri::Mount {
                    container_path: path.into(),
                    host_path: source.into(),
                    ..Default::default()
                });
                match parse(&c, &[], strict) {
                    Err(GpuError::Invalid(m)) => assert!(m.contains(path), "{m}"),
                    other => panic!("{path} <- {source}: {other:?}"),
                }
            }
            let mut c = config(&[], &[]);
            c.mounts.push(cri::Mount {
                container_path: path.into(),
                host_path: DEVICE_LIST_SOURCE.into(),
                ..Default::default()
            });
            assert!(parse(&c, &[], strict).unwrap().all, "{path}");
        }
    }

    #[test]
    fn without_limit_annotations_limits_come_from_the_device_plugins_env() {
        let strict = Policy {
            accept_env_requests: true,
            limit_annotations: false,
        };
        let pod = cri::PodSandboxConfig {
            annotations: [(ANNOTATION_MEMORY.to_string(), "64Gi".to_string())].into(),
            ..Default::default()
        };
        let c = config(
            &[(ENV_MEMORY_LIMIT, "999"), (ENV_MEMORY_LIMIT, "268435456")],
            &[(ANNOTATION_CORES, "100")],
        );
        let l = limits(&c, &pod, strict).unwrap();
        assert_eq!(
            l.memory.unwrap().value,
            256 << 20,
            "the last env value, not the pod's"
        );
        assert!(
            l.cores.is_none(),
            "the container's annotation does not count"
        );
        assert_eq!(container_limit_key(&c, strict), None);
        let e = limits(&config(&[(ENV_CORE_LIMIT, "0")], &[]), &pod, strict).unwrap_err();
        assert!(e.to_string().contains(ENV_CORE_LIMIT), "{e}");
    }

    #[test]
    fn bad_limits_are_named() {
        for (k, v, needle) in [
            (ANNOTATION_MEMORY, "12MB", "Ki, Mi, Gi or Ti"),
            (ANNOTATION_MEMORY, "0", "more than 0"),
            (ANNOTATION_MEMORY, "x", "Ki, Mi, Gi or Ti"),
            (ANNOTATION_MEMORY, "Mi", "whole number"),
            (ANNOTATION_CORES, "half", "percentage"),
            (ANNOTATION_VCUDA_MEMORY, "1Gi", "whole number"),
        ] {
            let e = limits(
                &config(&[], &[(k, v)]),
                &Default::default(),
                Policy::default(),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains(k) && e.contains(needle), "{e}");
        }
        assert_eq!(parse_memory(ANNOTATION_MEMORY, "1048576").unwrap(), 1 << 20);
    }

    #[test]
    fn cdi_names_from_the_field_and_annotations() {
        let mut c = config(
            &[],
            &[(
                "cdi.k8s.io/vendor_gpu0",
                "vendor.com/gpu=a,vendor.com/gpu=b",
            )],
        );
        c.cdi_devices = vec![cri::CdiDevice {
            name: "vendor.com/gpu=a".into(),
        }];
        let mut r = parse(&c, &[], Policy::default()).unwrap();
        r.cdi.sort();
        assert_eq!(r.cdi, ["vendor.com/gpu=a", "vendor.com/gpu=b"]);
        let c = config(&[], &[("cdi.k8s.io/x", "not a cdi name")]);
        let e = parse(&c, &[], Policy::default()).unwrap_err().to_string();
        assert!(e.contains("not a cdi name"), "{e}");
    }
}
