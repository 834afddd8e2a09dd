//! The wire contract: our CRI types (from `cri/runtime_v1.proto`) against the `k8s-cri` 0.11 types
//! (Kubernetes 1.32), which every kubelet and crictl of that age speaks.
//!
//! For every request and response message both have, a value with every field of ours set (built
//! from the proto file itself, so a field added there is covered without touching this test) is
//! encoded with our types, decoded with `k8s-cri`'s, encoded again and decoded with ours. Every
//! field they share must survive both decodes unchanged; only the fields added after 1.32 (listed
//! below) may be lost, and only those.

use std::collections::{BTreeMap, HashMap};

use crishim_proto::cri as ours;
use k8s_cri::v1 as old;
use prost::Message;
use serde_json::{json, Value};

/// Fields of cri-api v0.36 that `k8s-cri` 0.11 does not have (`Message.field`).
const NEW_SINCE_1_32: &[&str] = &[
    "ContainerConfig.stop_signal",
    "ContainerStatus.stop_signal",
    "ContainerStats.io",
    "LinuxPodSandboxStats.io",
    "CpuUsage.psi",
    "MemoryUsage.psi",
    "ImageSpec.image_ref",
    "Mount.image_sub_path",
    "RuntimeFeatures.user_namespaces_host_network",
    "Mount.mount_options",
    "RuntimeFeatures.mount_options",
];

struct Field {
    name: String,
    ty: String,
    repeated: bool,
    map: bool,
    number: u32,
}

/// Messages and enums of the proto file: just enough of a parser for our own file.
struct Schema {
    messages: HashMap<String, Vec<Field>>,
    enums: Vec<String>,
}

fn schema() -> Schema {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/cri/runtime_v1.proto"))
            .unwrap();
    let mut messages = HashMap::new();
    let mut enums = Vec::new();
    let mut current: Vec<String> = Vec::new();
    for raw in text.lines() {
        let line = raw.split("//").next().unwrap().trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[0] {
            "message" => {
                messages.insert(words[1].to_string(), Vec::new());
                // `message X {}` opens and closes on one line.
                if !line.ends_with("{}") {
                    current.push(words[1].to_string());
                }
            }
            "enum" => {
                enums.push(words[1].to_string());
                current.push(String::new());
            }
            "service" => current.push(String::new()),
            "}" => {
                current.pop();
            }
            _ => {
                let Some(msg) = current.last().filter(|m| !m.is_empty()) else {
                    continue;
                };
                let Some((decl, number)) = line.split_once('=') else {
                    continue;
                };
                let number: u32 = number
                    .trim()
                    .trim_end_matches(';')
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                let decl = decl.replace(", ", ",");
                let parts: Vec<&str> = decl.split_whitespace().collect();
                let (repeated, ty, name) = match parts.as_slice() {
                    ["repeated", ty, name] => (true, *ty, *name),
                    [ty, name] => (false, *ty, *name),
                    other => panic!("unparsed field {other:?}"),
                };
                messages.get_mut(msg).unwrap().push(Field {
                    name: snake(name),
                    map: ty.starts_with("map<"),
                    ty: ty.to_string(),
                    repeated,
                    number,
                });
            }
        }
    }
    Schema { messages, enums }
}

/// A field name as prost names it in Rust (`uidMappings` → `uid_mappings`, `CDI_devices` →
/// `cdi_devices`, `Avg10` → `avg10`).
fn snake(name: &str) -> String {
    let mut out = String::new();
    let chars: Vec<char> = name.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if c.is_uppercase() && i > 0 && (chars[i - 1].is_lowercase() || chars[i - 1].is_numeric()) {
            out.push('_');
        }
        out.extend(c.to_lowercase());
    }
    out
}

impl Schema {
    /// `msg` with every field set to a value that names it, as serde JSON of our type.
    fn filled(&self, msg: &str, depth: usize) -> Value {
        let mut obj = serde_json::Map::new();
        for f in &self.messages[msg] {
            let one = self.value(msg, f, depth);
            let v = if f.map {
                json!({ format!("{msg}.{}.key", f.name): format!("{msg}.{}", f.name) })
            } else if f.repeated {
                json!([one])
            } else {
                one
            };
            obj.insert(f.name.clone(), v);
        }
        Value::Object(obj)
    }

    fn value(&self, msg: &str, f: &Field, depth: usize) -> Value {
        let n = f.number as i64 * 7 + 1;
        match f.ty.as_str() {
            "string" => json!(format!("{msg}.{}", f.name)),
            "bytes" => json!(format!("{msg}.{}", f.name).into_bytes()),
            "bool" => json!(true),
            "double" => json!(n as f64 + 0.5),
            "int32" | "int64" | "uint32" | "uint64" => json!(n),
            t if t.starts_with("map<") => Value::Null,
            t if self
                .enums
                .iter()
                .any(|e| e == t || t.ends_with(&format!(".{e}"))) =>
            {
                json!(1)
            }
            t if t.contains('.') => json!(1), // a nested enum (SecurityProfile.ProfileType)
            t => {
                assert!(depth < 12, "the CRI has no recursive messages");
                self.filled(t, depth + 1)
            }
        }
    }
}

/// Compare the full value with what came back, at `path`: equal, or a new field lost whole.
fn compare(
    path: &str,
    msg: &str,
    full: &Value,
    back: &Value,
    schema: &Schema,
    lost: &mut Vec<String>,
) {
    match (full, back) {
        (Value::Object(a), Value::Object(b)) => {
            let fields: BTreeMap<_, _> =
                schema.messages.get(msg).map_or_else(BTreeMap::new, |fs| {
                    fs.iter().map(|f| (f.name.clone(), f)).collect()
                });
            for (k, av) in a {
                let bv = b.get(k).unwrap_or(&Value::Null);
                let f = fields.get(k);
                let key = format!("{msg}.{k}");
                if av != bv && NEW_SINCE_1_32.contains(&key.as_str()) {
                    assert!(
                        is_default(bv),
                        "{path}.{k}: a new field came back changed: {bv}"
                    );
                    lost.push(key);
                    continue;
                }
                match f {
                    Some(f) if !f.map => {
                        let ty = f.ty.as_str();
                        match (av, bv) {
                            (Value::Array(x), Value::Array(y)) if f.ty != "bytes" => {
                                assert_eq!(x.len(), y.len(), "{path}.{k}");
                                for (xi, yi) in x.iter().zip(y) {
                                    compare(&format!("{path}.{k}[]"), ty, xi, yi, schema, lost);
                                }
                            }
                            _ => compare(&format!("{path}.{k}"), ty, av, bv, schema, lost),
                        }
                    }
                    _ => assert_eq!(av, bv, "{path}.{k}"),
                }
            }
        }
        _ => assert_eq!(full, back, "{path}"),
    }
}

fn is_default(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// Round-trip a full `$name` through the old types; returns the new fields it lost.
macro_rules! roundtrip {
    ($schema:expr, $lost:expr, $($name:ident),+ $(,)?) => {$({
        let name = stringify!($name);
        let full = $schema.filled(name, 0);
        let ours_msg: ours::$name = serde_json::from_value(full.clone())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let wire = ours_msg.encode_to_vec();
        let old_msg = old::$name::decode(wire.as_slice())
            .unwrap_or_else(|e| panic!("{name}: k8s-cri cannot decode ours: {e}"));
        let back = ours::$name::decode(old_msg.encode_to_vec().as_slice())
            .unwrap_or_else(|e| panic!("{name}: we cannot decode k8s-cri's: {e}"));
        let back = serde_json::to_value(&back).unwrap();
        let full = serde_json::to_value(&ours_msg).unwrap();
        compare(name, name, &full, &back, &$schema, &mut $lost);
    })+};
}

#[test]
fn every_shared_field_survives_both_ways_and_only_new_fields_are_lost() {
    let schema = schema();
    assert!(
        schema.messages.len() > 150,
        "{} messages parsed",
        schema.messages.len()
    );
    let mut lost = Vec::new();
    roundtrip!(
        schema,
        lost,
        VersionRequest,
        VersionResponse,
        RunPodSandboxRequest,
        RunPodSandboxResponse,
        StopPodSandboxRequest,
        RemovePodSandboxRequest,
        PodSandboxStatusRequest,
        PodSandboxStatusResponse,
        ListPodSandboxRequest,
        ListPodSandboxResponse,
        CreateContainerRequest,
        CreateContainerResponse,
        StartContainerRequest,
        StopContainerRequest,
        RemoveContainerRequest,
        ListContainersRequest,
        ListContainersResponse,
        ContainerStatusRequest,
        ContainerStatusResponse,
        UpdateContainerResourcesRequest,
        ReopenContainerLogRequest,
        ExecSyncRequest,
        ExecSyncResponse,
        ExecRequest,
        ExecResponse,
        AttachRequest,
        AttachResponse,
        PortForwardRequest,
        PortForwardResponse,
        ContainerStatsRequest,
        ContainerStatsResponse,
        ListContainerStatsRequest,
        ListContainerStatsResponse,
        PodSandboxStatsRequest,
        PodSandboxStatsResponse,
        ListPodSandboxStatsRequest,
        ListPodSandboxStatsResponse,
        UpdateRuntimeConfigRequest,
        StatusRequest,
        StatusResponse,
        CheckpointContainerRequest,
        GetEventsRequest,
        ContainerEventResponse,
        ListMetricDescriptorsResponse,
        ListPodSandboxMetricsResponse,
        RuntimeConfigResponse,
        ListImagesRequest,
        ListImagesResponse,
        ImageStatusRequest,
        ImageStatusResponse,
        PullImageRequest,
        PullImageResponse,
        RemoveImageRequest,
        ImageFsInfoResponse,
        WindowsPodSandboxStats,
    );
    // Each new field was reached (and lost) somewhere: the comparison saw every one of them.
    for f in NEW_SINCE_1_32 {
        assert!(lost.iter().any(|l| l == f), "{f} was never exercised");
    }
}

#[test]
fn auth_config_debug_hides_the_secrets() {
    let a = ours::AuthConfig {
        username: "u".into(),
        password: "hunter2".into(),
        auth: "dTpodW50ZXIy".into(),
        identity_token: "id-t0ken-xyz".into(),
        ..Default::default()
    };
    let shown = format!("{a:?}");
    for secret in ["hunter2", "dTpodW50ZXIy", "id-t0ken-xyz"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    assert!(
        shown.contains("\"u\"") && shown.contains("[redacted]"),
        "{shown}"
    );
}
