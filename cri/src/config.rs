//! `/etc/crishim/config.toml`. The key names are a contract with users and scripts; unknown keys are
//! refused so a typo never silently falls back to a default.

use std::path::{Path, PathBuf};

use crishim_images::{ImagesConfig, RegistryConfig};
use serde::Deserialize;

mod nri;
pub use nri::NriConfig;

pub const DEFAULT_CONFIG: &str = "/etc/crishim/config.toml";
pub const DEFAULT_SOCKET: &str = "/run/crishim/crishim.sock";
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/crishim";
pub const DEFAULT_STATE_DIR: &str = "/run/crishim";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The CRI gRPC unix socket.
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// Persistent state: images, container layers, records.
    #[serde(default = "default_root_dir")]
    pub root_dir: PathBuf,
    /// Runtime state that does not survive a reboot.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    #[serde(default)]
    pub registry: RegistryConfig,
    /// `[images]`: what one pull may unpack, and the free space it must leave.
    #[serde(default)]
    pub images: ImagesConfig,
    /// Images reported as pinned, so the kubelet's image GC keeps them.
    #[serde(default)]
    pub pinned_images: Vec<String>,
    /// The per-pod shim binary; default: `crishim-shim` next to `crishim`.
    #[serde(default)]
    pub shim_binary: Option<PathBuf>,
    /// Run every container's program under crishim's minimal init (signal forwarding and
    /// reaping, like `docker run --init`). Per pod or container: annotation `crishim.io/init`.
    #[serde(default)]
    pub init: bool,
    /// That init; default: `crishim-init` next to `crishim`.
    #[serde(default)]
    pub init_binary: Option<PathBuf>,
    #[serde(default)]
    pub cni: CniConfig,
    #[serde(default)]
    pub streaming: StreamingConfig,
    /// `[gpu]`: GPU discovery and injection (see `crishim_gpu`).
    #[serde(default)]
    pub gpu: crishim_gpu::GpuConfig,
    /// `[metrics] address`: Prometheus text at `/metrics`; off when unset.
    #[serde(default)]
    pub metrics: crate::metrics::MetricsConfig,
    /// `cgroupfs` (crishim writes the cgroups) or `systemd` (each container is a transient scope
    /// in its pod's slice, made through systemd's D-Bus API; cgroup v2 only). It must match the
    /// kubelet's `--cgroup-driver`; `RuntimeConfig` reports it.
    #[serde(default)]
    pub cgroup_driver: crishim_spec::cgroups::CgroupDriver,
    /// `[runtimes.<name>]`: RuntimeClass handlers (see `crate::runtimes`).
    #[serde(default)]
    pub runtimes: std::collections::BTreeMap<String, crate::runtimes::RuntimeHandlerConfig>,
    /// `[nri]`: NRI plugins (see `crishim_nri`).
    #[serde(default)]
    pub nri: NriConfig,
}

/// `[streaming]`: the server behind the URLs that `Exec`, `Attach` and `PortForward` return.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamingConfig {
    /// `host:port`; port 0 picks a free one. The URLs name the address actually bound.
    #[serde(default = "default_streaming_address")]
    pub address: String,
    /// Serve HTTPS with this PEM certificate chain and key (both or neither).
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// How long a URL stays usable, once.
    #[serde(default = "default_token_ttl")]
    pub token_ttl_seconds: u64,
    /// Streaming connections served at once; over it, new ones get HTTP 503.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Serve plain HTTP on a non-loopback address: the one-time URLs, and what flows over them,
    /// then cross the network in clear. Refused unless set.
    #[serde(default)]
    pub allow_insecure: bool,
}

impl Default for StreamingConfig {
    fn default() -> Self {
        StreamingConfig {
            address: default_streaming_address(),
            tls_cert: None,
            tls_key: None,
            token_ttl_seconds: default_token_ttl(),
            max_connections: default_max_connections(),
            allow_insecure: false,
        }
    }
}

fn default_max_connections() -> usize {
    crishim_streaming::server::DEFAULT_MAX_CONNECTIONS
}

/// Each streaming session holds a socket or two and a few tasks; past this, descriptors run out.
const MAX_STREAMING_CONNECTIONS: usize = 65536;
/// A one-time URL valid longer than a day is a standing credential.
const MAX_TOKEN_TTL_SECONDS: u64 = 24 * 3600;

fn default_streaming_address() -> String {
    "127.0.0.1:0".into()
}

fn default_token_ttl() -> u64 {
    60
}

/// `[cni]`: where network configs and plugin binaries are found.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CniConfig {
    #[serde(default = "default_cni_conf_dir")]
    pub conf_dir: PathBuf,
    #[serde(default = "default_cni_bin_dirs")]
    pub bin_dirs: Vec<PathBuf>,
}

impl Default for CniConfig {
    fn default() -> Self {
        CniConfig {
            conf_dir: default_cni_conf_dir(),
            bin_dirs: default_cni_bin_dirs(),
        }
    }
}

fn default_cni_conf_dir() -> PathBuf {
    "/etc/cni/net.d".into()
}

fn default_cni_bin_dirs() -> Vec<PathBuf> {
    vec!["/opt/cni/bin".into(), "/usr/lib/cni".into()]
}

fn default_socket() -> PathBuf {
    DEFAULT_SOCKET.into()
}
fn default_root_dir() -> PathBuf {
    DEFAULT_ROOT_DIR.into()
}
fn default_state_dir() -> PathBuf {
    DEFAULT_STATE_DIR.into()
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: default_socket(),
            root_dir: default_root_dir(),
            state_dir: default_state_dir(),
            registry: RegistryConfig::default(),
            images: ImagesConfig::default(),
            pinned_images: Vec::new(),
            shim_binary: None,
            init: false,
            init_binary: None,
            cni: CniConfig::default(),
            streaming: StreamingConfig::default(),
            gpu: crishim_gpu::GpuConfig::default(),
            metrics: Default::default(),
            cgroup_driver: crishim_spec::cgroups::CgroupDriver::default(),
            runtimes: Default::default(),
            nri: NriConfig::default(),
        }
    }
}

impl Config {
    /// Load `path`. The default path may be absent (defaults apply); an explicit one must exist.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let (path, explicit) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if !explicit && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Config::default())
            }
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        Self::parse(&text, &path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: e.to_string(),
        })?;
        config.validate().map_err(|message| ConfigError::Invalid {
            path: path.into(),
            message,
        })?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), String> {
        for (key, p) in [
            ("socket", &self.socket),
            ("root_dir", &self.root_dir),
            ("state_dir", &self.state_dir),
        ] {
            if !p.is_absolute() {
                return Err(format!(
                    "{key} must be an absolute path, got {:?}",
                    p.display().to_string()
                ));
            }
        }
        self.streaming_server()?;
        self.gpu.validate()?;
        self.images.validate()?;
        crate::runtimes::validate(&self.runtimes)?;
        self.nri.validate()?;
        self.registry.validate()
    }

    /// The streaming server's settings, checked.
    pub fn streaming_server(&self) -> Result<crishim_streaming::Config, String> {
        let s = &self.streaming;
        let address: std::net::SocketAddr = s
            .address
            .parse()
            .map_err(|e| format!("[streaming] address {:?} is not host:port ({e})", s.address))?;
        let tls = match (&s.tls_cert, &s.tls_key) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            (None, None) => None,
            _ => return Err("[streaming] tls_cert and tls_key go together".into()),
        };
        if tls.is_none() && !address.ip().is_loopback() && !s.allow_insecure {
            return Err(format!(
                "[streaming] address {address} is not a loopback address and has no TLS: set \
                 tls_cert and tls_key, or allow_insecure = true to serve plain HTTP on it"
            ));
        }
        if !(1..=MAX_STREAMING_CONNECTIONS).contains(&s.max_connections) {
            return Err(format!(
                "[streaming] max_connections must be 1 to {MAX_STREAMING_CONNECTIONS}, got {}",
                s.max_connections
            ));
        }
        if !(1..=MAX_TOKEN_TTL_SECONDS).contains(&s.token_ttl_seconds) {
            return Err(format!(
                "[streaming] token_ttl_seconds must be 1 to {MAX_TOKEN_TTL_SECONDS}, got {}",
                s.token_ttl_seconds
            ));
        }
        Ok(crishim_streaming::Config {
            address,
            token_ttl: std::time::Duration::from_secs(s.token_ttl_seconds),
            tls,
            max_connections: s.max_connections,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(s, Path::new("test.toml"))
    }

    #[test]
    fn a_non_loopback_streaming_address_needs_tls_or_an_explicit_opt_in() {
        let e = parse("[streaming]\naddress = \"0.0.0.0:10010\"\n").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("0.0.0.0:10010") && msg.contains("allow_insecure"),
            "{msg}"
        );
        assert!(parse("[streaming]\naddress = \"[::1]:0\"\n").is_ok());
        let c = parse("[streaming]\naddress = \"0.0.0.0:0\"\nallow_insecure = true\n").unwrap();
        assert!(c.streaming.allow_insecure);
    }

    #[test]
    fn streaming_max_connections_defaults_to_256_and_is_bounded() {
        let c = parse("").unwrap();
        assert_eq!(c.streaming_server().unwrap().max_connections, 256);
        let c = parse("[streaming]\nmax_connections = 8\n").unwrap();
        assert_eq!(c.streaming_server().unwrap().max_connections, 8);
        assert!(parse("[streaming]\nmax_connections = 0\n").is_err());
        assert!(parse("[streaming]\ntoken_ttl_seconds = 100000000\n").is_err());
    }

    #[test]
    fn cgroup_driver_is_cgroupfs_or_systemd() {
        use crishim_spec::cgroups::CgroupDriver;
        assert_eq!(parse("").unwrap().cgroup_driver, CgroupDriver::Cgroupfs);
        assert_eq!(
            parse("cgroup_driver = \"systemd\"").unwrap().cgroup_driver,
            CgroupDriver::Systemd
        );
        assert!(parse("cgroup_driver = \"cgroupv2\"").is_err());
    }

    #[test]
    fn the_documented_example_parses() {
        let c = parse(
            r#"
socket = "/run/crishim/crishim.sock"
root_dir = "/var/lib/crishim"
state_dir = "/run/crishim"
[registry.mirrors."registry.k8s.io"]
endpoint = ["http://127.0.0.1:5000"]
[registry.configs."registry.example.com".auth]
username = "u"
password = "p"
[registry.configs."127.0.0.1:5000".tls]
insecure_skip_verify = true
"#,
        )
        .unwrap();
        assert_eq!(
            c.registry.mirrors["registry.k8s.io"].endpoint,
            ["http://127.0.0.1:5000"]
        );
        assert!(
            c.registry.configs["127.0.0.1:5000"]
                .tls
                .as_ref()
                .unwrap()
                .insecure_skip_verify
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_by_name() {
        let e = parse("sockett = \"/x\"").unwrap_err().to_string();
        assert!(e.contains("sockett"), "{e}");
        let e = parse("[registry.configs.\"h\".tls]\ninsecure = true")
            .unwrap_err()
            .to_string();
        assert!(e.contains("insecure"), "{e}");
        let e = parse("root_dir = \"relative\"").unwrap_err().to_string();
        assert!(e.contains("root_dir must be an absolute path"), "{e}");
        let e = parse("[registry.mirrors.\"docker.io\"]\nendpoint = [\"127.0.0.1:5000\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("registry.mirrors"), "{e}");
        let e = parse("socket = 5").unwrap_err().to_string();
        assert!(e.contains("socket"), "{e}");
    }

    #[test]
    fn images_limits_parse_and_are_checked() {
        let c = parse(
            "[images]\nmax_unpacked_bytes = 1048576\nmax_layer_entries = 10\nmin_free_percent = 20",
        )
        .unwrap();
        assert_eq!(c.images.max_unpacked_bytes, 1 << 20);
        assert_eq!(c.images.max_layer_entries, 10);
        assert_eq!(c.images.min_free_percent, 20);
        assert_eq!(parse("").unwrap().images, ImagesConfig::default());
        let e = parse("[images]\nmin_free_percent = 101")
            .unwrap_err()
            .to_string();
        assert!(e.contains("min_free_percent"), "{e}");
        let e = parse("[images]\nmax_entries = 1").unwrap_err().to_string();
        assert!(e.contains("max_entries"), "{e}");
    }

    #[test]
    fn nri_keys_are_containerds_with_its_defaults() {
        let n = parse("").unwrap().nri;
        assert_eq!(n, NriConfig::default());
        assert!(!n.enable);
        assert_eq!(n.socket_path, Path::new("/var/run/nri/nri.sock"));
        assert_eq!(n.plugin_path, Path::new("/opt/nri/plugins"));
        assert_eq!(n.plugin_config_path, Path::new("/etc/nri/conf.d"));
        assert_eq!(n.plugin_registration_timeout, "5s");
        assert_eq!(n.plugin_request_timeout, "2s");
        assert!(!n.disable_connections);
        let n = parse(
            r#"
[nri]
enable = true
socket_path = "/run/nri.sock"
plugin_path = "/p"
plugin_config_path = "/c"
plugin_registration_timeout = "1s"
plugin_request_timeout = "250ms"
disable_connections = true
"#,
        )
        .unwrap()
        .nri;
        assert!(n.enable && n.disable_connections);
        assert_eq!(
            n.request_timeout().unwrap(),
            std::time::Duration::from_millis(250)
        );
        let e = parse(
            "[nri]
enabled = true",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("enabled"), "{e}");
        let e = parse(
            "[nri]
plugin_request_timeout = \"2\"",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("plugin_request_timeout"), "{e}");
    }

    #[test]
    fn defaults_apply() {
        let c = parse("").unwrap();
        assert_eq!(c.socket, Path::new(DEFAULT_SOCKET));
        assert_eq!(c.root_dir, Path::new(DEFAULT_ROOT_DIR));
    }

    /// `[gpu]`, whose type (`GpuConfig`) is the GPU crate's.
    mod gpu_section {
        use super::*;
        use crishim_gpu::config::INTERCEPTOR_NAME;
        use crishim_gpu::InjectMode;

        fn parse(s: &str) -> Result<Config, String> {
            Config::parse(s, Path::new("test.toml")).map_err(|e| e.to_string())
        }

        #[test]
        fn the_section_is_optional_with_the_documented_defaults() {
            let g = parse("").unwrap().gpu;
            assert_eq!(g.device_root, Path::new("/dev"));
            assert_eq!(g.proc_root, Path::new("/proc"));
            assert_eq!(g.driver_root, Path::new("/"));
            assert_eq!(g.vdriver_dir, Path::new("/var/lib/crishim/gpu/vdriver"));
            assert_eq!(g.inject, InjectMode::Preload);
            assert_eq!(
                g.cdi_spec_dirs,
                [Path::new("/etc/cdi"), Path::new("/var/run/cdi")]
            );
            assert!(g.interceptor_path().ends_with(INTERCEPTOR_NAME));
        }

        #[test]
        fn every_key_parses_and_mistakes_are_named() {
            let g = parse(
                r#"
    [gpu]
    device_root = "/d"
    proc_root = "/p"
    driver_root = "/run/nvidia/driver"
    vdriver_dir = "/v"
    interceptor = "/opt/libcrishim_vgpu.so"
    inject = "replace"
    cdi_spec_dirs = ["/c"]
    "#,
            )
            .unwrap()
            .gpu;
            assert_eq!(g.inject, InjectMode::Replace);
            assert_eq!(g.interceptor_path(), Path::new("/opt/libcrishim_vgpu.so"));
            let e = parse("[gpu]\ndevice_rot = \"/d\"").unwrap_err();
            assert!(e.contains("device_rot"), "{e}");
            let e = parse("[gpu]\ninject = \"both\"").unwrap_err();
            assert!(e.contains("both"), "{e}");
            let e = parse("[gpu]\nvdriver_dir = \"v\"").unwrap_err();
            assert!(
                e.contains("gpu.vdriver_dir must be an absolute path"),
                "{e}"
            );
        }
    }
}
