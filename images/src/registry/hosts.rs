//! containerd's registry host configuration: `[registry] config_path` names a directory (a
//! containerd node's `/etc/containerd/certs.d` works as it is) holding `<host>/hosts.toml` per
//! registry, and `_default/hosts.toml` for every registry without one.
//!
//! ```toml
//! server = "https://registry-1.docker.io"        # the upstream; default https://<host>
//! [host."https://mirror.example.com"]           # tried first, in file order
//!   capabilities = ["pull", "resolve"]
//!   ca = "/etc/certs/mirror-ca.pem"              # string or list; relative to this file's dir
//!   client = [["client.crt", "client.key"]]      # cert+key pairs, or one combined PEM file
//!   skip_verify = false
//!   override_path = false                        # the URL's path is the API root, no /v2
//!   [host."https://mirror.example.com".header]
//!     x-custom = "value"                         # string or list of strings
//! ```
//!
//! The same keys (but `server`) may also stand at the top level, for the server itself. Every
//! file is hostile until read: sizes and counts are capped, and an unknown key or a bad value
//! is refused naming the file and the key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use reqwest::Url;

/// The directory that applies to every registry without one of its own.
pub const DEFAULT_DIR: &str = "_default";
const FILE_NAME: &str = "hosts.toml";
const MAX_FILE: u64 = 1 << 20;
const MAX_DIRS: usize = 4096;
const MAX_HOSTS: usize = 64;
const MAX_HEADERS: usize = 64;
const MAX_HEADER_VALUE: usize = 8 << 10;
const MAX_FILES_PER_KEY: usize = 16;
/// A CA bundle or a client certificate or key.
pub const MAX_PEM_FILE: u64 = 1 << 20;

/// What a host may be asked for: `resolve` a tag to a manifest, `pull` content by digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub pull: bool,
    pub resolve: bool,
}

impl Capabilities {
    const ALL: Capabilities = Capabilities {
        pull: true,
        resolve: true,
    };
}

/// One place to fetch a registry's content from, as `hosts.toml` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    /// `scheme://host[:port][/path]`, as written.
    pub url: Url,
    /// What `/<repository>/manifests/<ref>` is appended to: the URL with `/v2` appended, or
    /// the URL's own path with `override_path`.
    pub api: String,
    pub capabilities: Capabilities,
    pub skip_verify: bool,
    /// Extra root certificates (PEM files).
    pub ca: Vec<PathBuf>,
    /// Client certificates: (certificate, key), the key `None` when the file holds both.
    pub client: Vec<(PathBuf, Option<PathBuf>)>,
    pub headers: Vec<(String, String)>,
    /// The file's `server` (or the default one), not a `[host]` mirror.
    pub is_server: bool,
}

/// One `hosts.toml`: its hosts in the order they are tried; the server last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostsFile {
    pub hosts: Vec<HostEntry>,
    /// No `server` key: the registry itself is the server (and plain HTTP follows HTTPS for
    /// loopback and insecure hosts, as without a file).
    pub default_server: bool,
}

/// Every `hosts.toml` under `config_path`, read at start-up.
#[derive(Debug, Clone, Default)]
pub struct CertsDir {
    by_dir: BTreeMap<String, HostsFile>,
}

impl CertsDir {
    /// Read every `<dir>/hosts.toml` under `root`. A missing `root` is an empty set, as in
    /// containerd; an unreadable or malformed file is an error naming it.
    pub fn load(root: &Path) -> Result<Self, String> {
        let mut by_dir = BTreeMap::new();
        let entries = match std::fs::read_dir(root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(format!("registry.config_path {}: {e}", root.display())),
        };
        for entry in entries {
            let entry = entry.map_err(|e| format!("reading {}: {e}", root.display()))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let file = entry.path().join(FILE_NAME);
            if !file.is_file() {
                continue;
            }
            if by_dir.len() >= MAX_DIRS {
                return Err(format!(
                    "registry.config_path {}: more than {MAX_DIRS} host directories",
                    root.display()
                ));
            }
            let host = host_of_dir(&name);
            let parsed = parse_file(&file, &host)?;
            by_dir.insert(name, parsed);
        }
        Ok(CertsDir { by_dir })
    }

    /// The file for `registry` (`host[:port]`): `host_port_`, then `host:port`, then `_default`,
    /// as containerd looks them up.
    pub fn for_registry(&self, registry: &str) -> Option<&HostsFile> {
        let mut names = Vec::new();
        if let Some((host, port)) = registry.rsplit_once(':') {
            if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
                names.push(format!("{host}_{port}_"));
            }
        }
        names.push(registry.to_string());
        names.push(DEFAULT_DIR.to_string());
        names.iter().find_map(|n| self.by_dir.get(n))
    }

    /// Every host entry, for building their TLS clients and the plain-HTTP list.
    pub fn entries(&self) -> impl Iterator<Item = &HostEntry> {
        self.by_dir.values().flat_map(|f| f.hosts.iter())
    }
}

/// `host_port_` names `host:port` (a colon is awkward in paths); `_default` names no host.
fn host_of_dir(name: &str) -> String {
    if let Some(stem) = name.strip_suffix('_') {
        if let Some((host, port)) = stem.rsplit_once('_') {
            if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
                return format!("{host}:{port}");
            }
        }
    }
    name.to_string()
}

/// The server containerd assumes without a `server` key.
fn default_server_url(host: &str) -> String {
    match host {
        "docker.io" => "https://registry-1.docker.io".into(),
        _ => format!("https://{host}"),
    }
}

/// Read and parse one file; `host` is the registry its directory names.
pub fn parse_file(path: &Path, host: &str) -> Result<HostsFile, String> {
    let fail = |m: String| format!("{}: {m}", path.display());
    let bytes =
        crishim_sys::hostfs::read_capped(path, MAX_FILE).map_err(|e| fail(e.to_string()))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| fail("stream did not contain valid UTF-8".to_string()))?;
    let base = path.parent().unwrap_or(Path::new("/"));
    parse(&text, host, base).map_err(fail)
}

/// Parse a file's text. Relative certificate paths are taken from `base`.
pub fn parse(text: &str, host: &str, base: &Path) -> Result<HostsFile, String> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("not valid TOML: {}", e.message()))?;
    let mut server = None;
    let mut mirrors = Vec::new();
    let mut top = toml::Table::new();
    for (key, value) in table {
        match key.as_str() {
            "server" => {
                server = Some(
                    value
                        .as_str()
                        .ok_or("server: must be a URL string")?
                        .to_string(),
                )
            }
            "host" => {
                let hosts = value.as_table().ok_or("host: must be a table of URLs")?;
                if hosts.len() > MAX_HOSTS {
                    return Err(format!("host: more than {MAX_HOSTS} hosts"));
                }
                for (url, fields) in hosts {
                    let fields = fields
                        .as_table()
                        .ok_or_else(|| format!("host.{url:?}: must be a table"))?;
                    let entry = entry(url, fields, base, false)
                        .map_err(|e| qualify(&format!("host.{url:?}"), &e))?;
                    mirrors.push(entry);
                }
            }
            _ => {
                top.insert(key, value);
            }
        }
    }
    let default_server = server.is_none();
    let server_url = server.unwrap_or_else(|| default_server_url(host));
    // Top-level keys are named as they stand; the URL itself is `server`.
    let server_entry =
        entry(&server_url, &top, base, true).map_err(|e| match e.strip_prefix(':') {
            Some(rest) => format!("server:{rest}"),
            None => e,
        })?;
    mirrors.push(server_entry);
    Ok(HostsFile {
        hosts: mirrors,
        default_server,
    })
}

/// `prefix.key: ...` for an error about a key, `prefix: ...` for one about the URL.
fn qualify(prefix: &str, e: &str) -> String {
    if e.starts_with(':') {
        format!("{prefix}{e}")
    } else {
        format!("{prefix}.{e}")
    }
}

/// One host from its URL and fields. Errors start with the key at fault (`ca: ...`), or with
/// `:` when the URL is.
fn entry(
    url: &str,
    fields: &toml::Table,
    base: &Path,
    is_server: bool,
) -> Result<HostEntry, String> {
    let parsed = Url::parse(url).map_err(|e| format!(": {url:?} is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(format!(": {url:?} must be http(s)://host[:port][/path]"));
    }
    let mut capabilities = Capabilities::ALL;
    let mut skip_verify = false;
    let mut override_path = false;
    let mut ca = Vec::new();
    let mut client = Vec::new();
    let mut headers = Vec::new();
    for (key, value) in fields {
        let k = key.as_str();
        match k {
            "capabilities" => {
                let list = value.as_array().ok_or("capabilities: must be a list")?;
                capabilities = Capabilities {
                    pull: false,
                    resolve: false,
                };
                for c in list {
                    match c.as_str() {
                        Some("pull") => capabilities.pull = true,
                        Some("resolve") => capabilities.resolve = true,
                        // Pushing is not a runtime's business; accepted so containerd's files load.
                        Some("push") => {}
                        _ => {
                            return Err(format!(
                                "capabilities: {c} is not one of \"pull\", \"resolve\", \"push\""
                            ))
                        }
                    }
                }
            }
            "skip_verify" => {
                skip_verify = value
                    .as_bool()
                    .ok_or("skip_verify: must be true or false")?
            }
            "override_path" => {
                override_path = value
                    .as_bool()
                    .ok_or("override_path: must be true or false")?
            }
            "ca" => {
                ca = strings(value)
                    .ok_or("ca: must be a path or a list of paths")?
                    .into_iter()
                    .map(|p| pem_path(base, &p))
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("ca: {e}"))?
            }
            "client" => client = clients(value, base).map_err(|e| format!("client: {e}"))?,
            "header" => headers = header_table(value).map_err(|e| format!("header{e}"))?,
            other => {
                return Err(format!(
                    "{other}: unknown key (known: capabilities, ca, client, skip_verify, \
                     override_path, header)"
                ))
            }
        }
    }
    let api = if override_path {
        parsed.as_str().trim_end_matches('/').to_string()
    } else {
        let trimmed = parsed.as_str().trim_end_matches('/');
        if trimmed.ends_with("/v2") {
            trimmed.to_string()
        } else {
            format!("{trimmed}/v2")
        }
    };
    Ok(HostEntry {
        url: parsed,
        api,
        capabilities,
        skip_verify,
        ca,
        client,
        headers,
        is_server,
    })
}

/// A string, or a list of strings.
fn strings(value: &toml::Value) -> Option<Vec<String>> {
    match value {
        toml::Value::String(s) => Some(vec![s.clone()]),
        toml::Value::Array(a) if a.len() <= MAX_FILES_PER_KEY => {
            a.iter().map(|v| v.as_str().map(str::to_owned)).collect()
        }
        _ => None,
    }
}

/// `client = "combined.pem"`, `["a.pem", ["b.crt", "b.key"]]` or `[["c.crt", "c.key"]]`.
fn clients(value: &toml::Value, base: &Path) -> Result<Vec<(PathBuf, Option<PathBuf>)>, String> {
    let items: Vec<toml::Value> = match value {
        toml::Value::String(_) => vec![value.clone()],
        toml::Value::Array(a) if a.len() <= MAX_FILES_PER_KEY => a.clone(),
        _ => return Err("must be a path, or a list of paths and [certificate, key] pairs".into()),
    };
    items
        .iter()
        .map(|item| match item {
            toml::Value::String(s) => Ok((pem_path(base, s)?, None)),
            toml::Value::Array(pair) => match pair.as_slice() {
                [toml::Value::String(c), toml::Value::String(k)] => {
                    Ok((pem_path(base, c)?, Some(pem_path(base, k)?)))
                }
                _ => Err("a pair must be [certificate, key]".to_string()),
            },
            _ => Err("must be a path, or a list of paths and [certificate, key] pairs".into()),
        })
        .collect()
}

/// A certificate or key path (relative ones from the file's directory), which must be a
/// readable file within [`MAX_PEM_FILE`].
fn pem_path(base: &Path, p: &str) -> Result<PathBuf, String> {
    let path = base.join(p);
    let meta = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() || meta.len() > MAX_PEM_FILE {
        return Err(format!(
            "{}: must be a file of at most {MAX_PEM_FILE} bytes",
            path.display()
        ));
    }
    Ok(path)
}

/// `header.<name> = "v"` or `["v1", "v2"]`. Errors start with `.<name>: ` or `: `.
fn header_table(value: &toml::Value) -> Result<Vec<(String, String)>, String> {
    let table = value.as_table().ok_or(": must be a table of names")?;
    let mut out = Vec::new();
    for (name, v) in table {
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!(".{name:?}: not a valid header name"));
        }
        let values = strings(v).ok_or_else(|| format!(".{name}: must be a string or a list"))?;
        for v in values {
            if v.len() > MAX_HEADER_VALUE || reqwest::header::HeaderValue::from_str(&v).is_err() {
                return Err(format!(
                    ".{name}: not a valid header value of at most {MAX_HEADER_VALUE} bytes"
                ));
            }
            out.push((name.clone(), v));
        }
        if out.len() > MAX_HEADERS {
            return Err(format!(": more than {MAX_HEADERS} values"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_here(text: &str, host: &str) -> Result<HostsFile, String> {
        parse(text, host, Path::new("/"))
    }

    #[test]
    fn hosts_come_in_file_order_then_the_server() {
        let f = parse_here(
            r#"
server = "https://registry-1.docker.io"
[host."https://b.example.com"]
capabilities = ["pull"]
[host."http://a.example.com:5000/prefix"]
override_path = true
skip_verify = true
[host."http://a.example.com:5000/prefix".header]
x-one = "1"
x-many = ["a", "b"]
"#,
            "docker.io",
        )
        .unwrap();
        let urls: Vec<_> = f.hosts.iter().map(|h| h.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "https://b.example.com/",
                "http://a.example.com:5000/prefix",
                "https://registry-1.docker.io/"
            ]
        );
        assert_eq!(
            f.hosts[0].capabilities,
            Capabilities {
                pull: true,
                resolve: false
            }
        );
        assert_eq!(f.hosts[0].api, "https://b.example.com/v2");
        assert_eq!(f.hosts[1].api, "http://a.example.com:5000/prefix");
        assert!(f.hosts[1].skip_verify);
        assert_eq!(f.hosts[1].headers.len(), 3);
        assert!(f.hosts[2].is_server && !f.default_server);
        assert_eq!(f.hosts[2].capabilities, Capabilities::ALL);
    }

    #[test]
    fn without_server_the_registry_is_its_own() {
        let f = parse_here("", "docker.io").unwrap();
        assert!(f.default_server);
        assert_eq!(f.hosts[0].api, "https://registry-1.docker.io/v2");
        let f = parse_here("skip_verify = true\n", "127.0.0.1:5000").unwrap();
        assert_eq!(f.hosts[0].api, "https://127.0.0.1:5000/v2");
        assert!(f.hosts[0].skip_verify);
    }

    #[test]
    fn malformed_files_are_refused_naming_the_key() {
        for (text, key) in [
            ("server = 1\n", "server:"),
            ("server = \"ftp://x\"\n", "server:"),
            ("mirrors = []\n", "mirrors: unknown key"),
            (
                "[host.\"https://m\"]\ncapabilities = [\"fetch\"]\n",
                "host.\"https://m\".capabilities",
            ),
            (
                "[host.\"https://m\"]\nskip_verify = \"yes\"\n",
                "host.\"https://m\".skip_verify",
            ),
            (
                "[host.\"https://m\"]\nca = \"/nonexistent/ca.pem\"\n",
                "host.\"https://m\".ca",
            ),
            (
                "[host.\"https://m\"]\nclient = [[\"/etc/hostname\"]]\n",
                "host.\"https://m\".client",
            ),
            (
                "[host.\"https://m\".header]\n\"bad name\" = \"v\"\n",
                "host.\"https://m\".header",
            ),
            (
                "[host.\"https://m\".header]\nx = \"a\\nb\"\n",
                "host.\"https://m\".header.x",
            ),
            ("[host.\"not a url\"]\n", "host.\"not a url\":"),
            ("this is not toml", "not valid TOML"),
        ] {
            let e = parse_here(text, "docker.io").unwrap_err();
            assert!(e.starts_with(key), "{text:?}: {e}");
        }
    }

    #[test]
    fn sizes_and_counts_are_capped() {
        let many: String = (0..=MAX_HOSTS)
            .map(|i| format!("[host.\"https://m{i}\"]\n"))
            .collect();
        assert!(parse_here(&many, "x").unwrap_err().contains("more than"));
        let headers: String = (0..=MAX_HEADERS)
            .map(|i| format!("h{i} = \"v\"\n"))
            .collect();
        let e = parse_here(&format!("[header]\n{headers}"), "x").unwrap_err();
        assert!(e.contains("more than"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts.toml");
        std::fs::write(&path, vec![b'#'; MAX_FILE as usize + 1]).unwrap();
        let e = parse_file(&path, "x").unwrap_err();
        assert!(e.contains("larger than"), "{e}");
    }

    #[test]
    fn directories_are_found_as_containerd_finds_them() {
        let dir = tempfile::tempdir().unwrap();
        for (name, server) in [
            ("docker.io", "https://a.example"),
            ("127.0.0.1_5000_", "http://b.example"),
            (DEFAULT_DIR, "https://c.example"),
        ] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
            std::fs::write(
                dir.path().join(name).join("hosts.toml"),
                format!("server = \"{server}\"\n"),
            )
            .unwrap();
        }
        // A directory without hosts.toml is not a host.
        std::fs::create_dir(dir.path().join("quay.io")).unwrap();
        let c = CertsDir::load(dir.path()).unwrap();
        let server = |r: &str| {
            c.for_registry(r).unwrap().hosts[0]
                .url
                .host_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(server("docker.io"), "a.example");
        assert_eq!(server("127.0.0.1:5000"), "b.example");
        assert_eq!(server("quay.io"), "c.example");
        assert_eq!(host_of_dir("127.0.0.1_5000_"), "127.0.0.1:5000");
        assert_eq!(host_of_dir("my_host"), "my_host");
        assert!(CertsDir::load(&dir.path().join("absent"))
            .unwrap()
            .for_registry("x")
            .is_none());
    }

    #[test]
    fn relative_certificate_paths_are_taken_from_the_files_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), "x").unwrap();
        std::fs::write(dir.path().join("c.crt"), "x").unwrap();
        std::fs::write(dir.path().join("c.key"), "x").unwrap();
        let f = parse(
            "ca = \"ca.pem\"\nclient = [[\"c.crt\", \"c.key\"]]\n",
            "x",
            dir.path(),
        )
        .unwrap();
        assert_eq!(f.hosts[0].ca, [dir.path().join("ca.pem")]);
        assert_eq!(
            f.hosts[0].client,
            [(dir.path().join("c.crt"), Some(dir.path().join("c.key")))]
        );
    }
}
