//! Network configuration: discovery in the conf dir, `.conf` wrapping, and building the
//! per-plugin config that a plugin reads on stdin.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// File name extensions of network configs, as libcni knows them.
pub const CONFIG_EXTENSIONS: [&str; 3] = ["conflist", "conf", "json"];

/// A network configuration list (a `.conflist`, or a `.conf` wrapped as a one-plugin list).
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkList {
    /// The network's `name`.
    pub name: String,
    /// The list's `cniVersion` ("" when the file has none, as libcni passes it).
    pub cni_version: String,
    /// `disableCheck`: CHECK is skipped for this network.
    pub disable_check: bool,
    /// The plugin configs, in ADD order; each is a JSON object with a non-empty `type`.
    pub plugins: Vec<Value>,
    /// The file the list was read from (empty when built from JSON in memory).
    pub source: PathBuf,
}

impl NetworkList {
    /// A list from a parsed `.conflist` (`{"name", "cniVersion", "plugins": [...]}`).
    pub fn from_list_json(value: Value, source: PathBuf) -> Result<Self, String> {
        let Value::Object(mut obj) = value else {
            return Err("a network config list must be a JSON object".into());
        };
        let name = match obj.get("name") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::String(_)) | None => return Err("the list has no \"name\"".into()),
            Some(_) => return Err("\"name\" must be a string".into()),
        };
        let cni_version = match obj.get("cniVersion") {
            Some(Value::String(s)) => s.clone(),
            None => String::new(),
            Some(_) => return Err("\"cniVersion\" must be a string".into()),
        };
        let disable_check = match obj.get("disableCheck") {
            Some(Value::Bool(b)) => *b,
            // Some configs write it as a string.
            Some(Value::String(s)) => s == "true",
            None | Some(Value::Null) => false,
            Some(_) => return Err("\"disableCheck\" must be a boolean".into()),
        };
        let plugins = match obj.remove("plugins") {
            Some(Value::Array(p)) => p,
            Some(_) => return Err("\"plugins\" must be an array".into()),
            None => return Err("the list has no \"plugins\"".into()),
        };
        if plugins.is_empty() {
            return Err("the list has no plugins".into());
        }
        for (i, p) in plugins.iter().enumerate() {
            validate_plugin(p).map_err(|e| format!("plugin {i}: {e}"))?;
        }
        Ok(NetworkList {
            name,
            cni_version,
            disable_check,
            plugins,
            source,
        })
    }

    /// A one-plugin list from a parsed `.conf` (a single plugin config, with its own `name`
    /// and `cniVersion`), as libcni's `ConfListFromConf` wraps it.
    pub fn from_conf_json(value: Value, source: PathBuf) -> Result<Self, String> {
        let Value::Object(obj) = &value else {
            return Err("a network config must be a JSON object".into());
        };
        if !obj.contains_key("type") && obj.contains_key("plugins") {
            // A list saved under `.conf`/`.json` (kubelet and CRI-O skip these; accepting
            // them is harmless since the shape is unambiguous).
            return Self::from_list_json(value, source);
        }
        validate_plugin(&value)?;
        let mut list = Map::new();
        for key in ["name", "cniVersion", "disableCheck"] {
            if let Some(v) = obj.get(key) {
                list.insert(key.to_string(), v.clone());
            }
        }
        list.insert("plugins".to_string(), Value::Array(vec![value.clone()]));
        Self::from_list_json(Value::Object(list), source)
    }

    /// Reads a config file: `.conflist` as a list, anything else as a single plugin config.
    pub fn load_file(path: &Path) -> Result<Self, String> {
        let data = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
        let value: Value =
            serde_json::from_slice(&data).map_err(|e| format!("invalid JSON: {e}"))?;
        if path.extension().is_some_and(|e| e == "conflist") {
            Self::from_list_json(value, path.to_path_buf())
        } else {
            Self::from_conf_json(value, path.to_path_buf())
        }
    }

    /// The list as `.conflist` JSON (what the result cache stores).
    pub fn to_json(&self) -> Value {
        let mut obj = Map::new();
        obj.insert("name".into(), Value::String(self.name.clone()));
        obj.insert("cniVersion".into(), Value::String(self.cni_version.clone()));
        if self.disable_check {
            obj.insert("disableCheck".into(), Value::Bool(true));
        }
        obj.insert("plugins".into(), Value::Array(self.plugins.clone()));
        Value::Object(obj)
    }

    /// The `type` of plugin `i` (validated at load time).
    pub fn plugin_type(&self, i: usize) -> &str {
        self.plugins[i]
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// Whether the list's version passes `prevResult` on DEL and knows CHECK (>= 0.4.0).
    pub fn has_cached_results(&self) -> bool {
        version_cmp(&self.cni_version, "0.4.0") != Ordering::Less
    }
}

fn validate_plugin(p: &Value) -> Result<(), String> {
    let Value::Object(obj) = p else {
        return Err("a plugin config must be a JSON object".into());
    };
    match obj.get("type") {
        Some(Value::String(t)) if !t.is_empty() => {
            if t.contains('/') || t == "." || t == ".." {
                return Err(format!("invalid plugin type {t:?}"));
            }
        }
        Some(Value::String(_)) | None => return Err("no plugin \"type\"".into()),
        Some(_) => return Err("\"type\" must be a string".into()),
    }
    match obj.get("capabilities") {
        None | Some(Value::Null) | Some(Value::Object(_)) => Ok(()),
        Some(_) => Err("\"capabilities\" must be an object".into()),
    }
}

/// The config files in `dir` (`.conflist`, `.conf`, `.json`; not directories), sorted by
/// file name.
pub fn config_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let wanted = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| CONFIG_EXTENSIONS.contains(&e));
        // Follow symlinks: configs are often links into a package's directory.
        if wanted && std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            files.push(path);
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

/// The network to use: the first config file in `dir` (sorted by name) that loads. Files
/// that do not load are skipped (as CRI-O and the kubelet did), and named in the error when
/// none loads.
pub fn discover(dir: &Path) -> Result<NetworkList, String> {
    let files = config_files(dir)
        .map_err(|e| format!("cannot read CNI config dir {}: {e}", dir.display()))?;
    let mut skipped = Vec::new();
    for file in files {
        match NetworkList::load_file(&file) {
            Ok(list) => {
                for reason in &skipped {
                    tracing::warn!("skipping CNI config {reason}");
                }
                return Ok(list);
            }
            Err(e) => skipped.push(format!("{}: {e}", file.display())),
        }
    }
    let mut msg = format!("no network config found in {}", dir.display());
    if !skipped.is_empty() {
        msg.push_str(" (invalid: ");
        msg.push_str(&skipped.join("; "));
        msg.push(')');
    }
    Err(msg)
}

/// The config given to plugin `index` of `list` on stdin: the plugin's own object with the
/// list's `name` and `cniVersion`, `prevResult` when given, and `runtimeConfig` holding those
/// of `capability_args` that the plugin declares `true` in its `capabilities` (none: no
/// `runtimeConfig` is added, as libcni does).
pub fn plugin_config(
    list: &NetworkList,
    index: usize,
    prev_result: Option<&Value>,
    capability_args: &BTreeMap<String, Value>,
) -> Value {
    let mut conf = list.plugins[index].clone();
    let Value::Object(obj) = &mut conf else {
        unreachable!("plugin configs are validated as objects")
    };
    obj.insert("name".into(), Value::String(list.name.clone()));
    if !list.cni_version.is_empty() || !obj.contains_key("cniVersion") {
        obj.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
    }
    if let Some(prev) = prev_result {
        obj.insert("prevResult".into(), prev.clone());
    }
    let mut runtime = Map::new();
    if let Some(Value::Object(caps)) = obj.get("capabilities") {
        for (cap, enabled) in caps {
            if enabled.as_bool() == Some(true) {
                if let Some(arg) = capability_args.get(cap) {
                    runtime.insert(cap.clone(), arg.clone());
                }
            }
        }
    }
    if !runtime.is_empty() {
        obj.insert("runtimeConfig".into(), Value::Object(runtime));
    }
    conf
}

/// Compares CNI versions (`major.minor.patch`, missing parts are 0; "" is 0.1.0 as the
/// plugins read it).
pub fn version_cmp(a: &str, b: &str) -> Ordering {
    fn parts(v: &str) -> [u64; 3] {
        let v = if v.is_empty() { "0.1.0" } else { v };
        let mut out = [0; 3];
        for (slot, p) in out.iter_mut().zip(v.split('.')) {
            *slot = p
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap_or(0);
        }
        out
    }
    parts(a).cmp(&parts(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn write(dir: &Path, name: &str, v: &str) {
        std::fs::write(dir.join(name), v).unwrap();
    }

    fn conflist(name: &str) -> String {
        json!({"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "bridge"}]}).to_string()
    }

    #[test]
    fn discovery_takes_first_sorted_file_of_known_extensions() {
        let dir = tempfile::tempdir().unwrap();
        assert!(discover(dir.path())
            .unwrap_err()
            .contains("no network config"));
        write(dir.path(), "99-last.conflist", &conflist("last"));
        write(dir.path(), "50-mid.json", &conflist("mid"));
        write(dir.path(), "00-ignored.txt", &conflist("txt"));
        write(dir.path(), "00-ignored.conflist.bak", &conflist("bak"));
        std::fs::create_dir(dir.path().join("01-dir.conf")).unwrap();
        let names: Vec<_> = config_files(dir.path())
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["50-mid.json", "99-last.conflist"]);
        assert_eq!(discover(dir.path()).unwrap().name, "mid");
        write(dir.path(), "10-first.conflist", &conflist("first"));
        let list = discover(dir.path()).unwrap();
        assert_eq!(list.name, "first");
        assert_eq!(list.source, dir.path().join("10-first.conflist"));
        // Lexical, not numeric.
        write(dir.path(), "1-one.conf", &conflist("one"));
        assert_eq!(discover(dir.path()).unwrap().name, "one");
    }

    #[test]
    fn discovery_skips_invalid_files_and_names_them() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "00-broken.conflist", "{not json");
        write(
            dir.path(),
            "01-noplugins.conflist",
            r#"{"name":"x","plugins":[]}"#,
        );
        write(
            dir.path(),
            "02-notype.conf",
            r#"{"name":"x","cniVersion":"1.0.0"}"#,
        );
        let err = discover(dir.path()).unwrap_err();
        assert!(err.contains("00-broken.conflist: invalid JSON"), "{err}");
        assert!(
            err.contains("01-noplugins.conflist: the list has no plugins"),
            "{err}"
        );
        assert!(err.contains("02-notype.conf: no plugin \"type\""), "{err}");
        write(dir.path(), "03-ok.conflist", &conflist("ok"));
        assert_eq!(discover(dir.path()).unwrap().name, "ok");
        let missing = dir.path().join("missing");
        assert!(discover(&missing)
            .unwrap_err()
            .contains("cannot read CNI config dir"));
    }

    #[test]
    fn conf_is_wrapped_as_one_plugin_list() {
        let conf = json!({
            "cniVersion": "0.4.0", "name": "single", "type": "bridge", "bridge": "cni0",
            "ipam": {"type": "host-local", "subnet": "10.1.0.0/16"}
        });
        let list = NetworkList::from_conf_json(conf.clone(), "x.conf".into()).unwrap();
        assert_eq!(list.name, "single");
        assert_eq!(list.cni_version, "0.4.0");
        assert_eq!(list.plugins, vec![conf.clone()]);
        assert_eq!(list.plugin_type(0), "bridge");
        assert!(list.has_cached_results());
        let built = plugin_config(&list, 0, None, &BTreeMap::new());
        assert_eq!(built, conf);
        // The round trip through the cache keeps it.
        let again = NetworkList::from_list_json(list.to_json(), "x.conf".into()).unwrap();
        assert_eq!(again, list);
        // A list saved as .json is a list.
        let list2 =
            NetworkList::from_conf_json(serde_json::from_str(&conflist("l")).unwrap(), "".into())
                .unwrap();
        assert_eq!(list2.name, "l");
    }

    #[test]
    fn invalid_lists_are_rejected() {
        let bad = [
            (json!([]), "JSON object"),
            (json!({"plugins": [{"type": "x"}]}), "no \"name\""),
            (json!({"name": "n"}), "no \"plugins\""),
            (
                json!({"name": "n", "plugins": [{}]}),
                "plugin 0: no plugin \"type\"",
            ),
            (
                json!({"name": "n", "plugins": [{"type": "../sh"}]}),
                "invalid plugin type",
            ),
            (
                json!({"name": "n", "plugins": [{"type": "x", "capabilities": 1}]}),
                "capabilities",
            ),
            (
                json!({"name": "n", "cniVersion": 1, "plugins": [{"type": "x"}]}),
                "cniVersion",
            ),
        ];
        for (v, want) in bad {
            let err = NetworkList::from_list_json(v.clone(), "".into()).unwrap_err();
            assert!(err.contains(want), "{v}: {err}");
        }
    }

    #[test]
    fn plugin_config_injects_name_version_prev_result_and_declared_capabilities() {
        let list = NetworkList::from_list_json(
            json!({
                "cniVersion": "1.0.0", "name": "net",
                "plugins": [
                    {"type": "bridge", "cniVersion": "0.3.1", "name": "other"},
                    {"type": "portmap", "capabilities": {"portMappings": true, "dns": false}},
                    {"type": "dnsish", "capabilities": {"dns": true, "unknown": true},
                     "runtimeConfig": {"stale": 1}},
                ]
            }),
            "".into(),
        )
        .unwrap();
        let mut caps = BTreeMap::new();
        caps.insert(
            "portMappings".to_string(),
            json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]),
        );
        caps.insert("dns".to_string(), json!({"servers": ["10.0.0.10"]}));

        let first = plugin_config(&list, 0, None, &caps);
        assert_eq!(
            first,
            json!({"type": "bridge", "cniVersion": "1.0.0", "name": "net"}),
            "list name and version win, no prevResult, no runtimeConfig"
        );

        let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.2/24"}]});
        let second = plugin_config(&list, 1, Some(&prev), &caps);
        assert_eq!(second["prevResult"], prev);
        assert_eq!(
            second["runtimeConfig"],
            json!({"portMappings": caps["portMappings"]}),
            "only declared and enabled capabilities"
        );

        let third = plugin_config(&list, 2, Some(&prev), &caps);
        assert_eq!(third["runtimeConfig"], json!({"dns": caps["dns"]}));

        // Without the args, a plugin's own runtimeConfig stays untouched.
        let third = plugin_config(&list, 2, None, &BTreeMap::new());
        assert_eq!(third["runtimeConfig"], json!({"stale": 1}));
        assert!(third.get("prevResult").is_none());
    }

    #[test]
    fn versions_compare_numerically() {
        assert_eq!(version_cmp("0.4.0", "0.4.0"), Ordering::Equal);
        assert_eq!(version_cmp("0.3.1", "0.4.0"), Ordering::Less);
        assert_eq!(version_cmp("1.0.0", "0.4.0"), Ordering::Greater);
        assert_eq!(version_cmp("0.10.0", "0.4.0"), Ordering::Greater);
        assert_eq!(version_cmp("", "0.2.0"), Ordering::Less);
        assert_eq!(version_cmp("1.1", "1.0.9"), Ordering::Greater);
    }
}
