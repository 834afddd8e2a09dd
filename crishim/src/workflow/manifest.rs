//! The Pod manifest of a run: parsed with the `k8s-openapi` types after every field has been
//! checked against what a run honours, so an unsupported field is refused by name before anything
//! starts (k8s-openapi itself would drop unknown fields silently).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::Value;

use super::error::WorkflowError;

/// Annotation naming `containers` that are sidecars (comma-separated). Without it, when one
/// container is named `main`, the others are its sidecars (Argo's convention); otherwise every
/// container is main work.
pub const SIDECARS_ANNOTATION: &str = "crishim.io/sidecars";
/// Annotation prefix declaring an output: `crishim.io/outputs.<name>: <container>:<path>`.
pub const OUTPUT_PREFIX: &str = "crishim.io/outputs.";

/// The fields a run honours, as a tree; anything else is refused.
enum Shape {
    /// A scalar, or a value whose content is checked after parsing.
    Leaf,
    Object(&'static [(&'static str, Shape)]),
    List(&'static Shape),
}

use Shape::{Leaf, List, Object};

const CONTAINER: Shape = Object(&[
    ("name", Leaf),
    ("image", Leaf),
    ("imagePullPolicy", Leaf),
    ("command", Leaf),
    ("args", Leaf),
    ("env", List(&Object(&[("name", Leaf), ("value", Leaf)]))),
    ("workingDir", Leaf),
    (
        "volumeMounts",
        List(&Object(&[
            ("name", Leaf),
            ("mountPath", Leaf),
            ("readOnly", Leaf),
            ("subPath", Leaf),
        ])),
    ),
    ("resources", Object(&[("limits", Leaf), ("requests", Leaf)])),
    (
        "securityContext",
        Object(&[
            ("runAsUser", Leaf),
            ("runAsGroup", Leaf),
            ("readOnlyRootFilesystem", Leaf),
            ("capabilities", Object(&[("add", Leaf), ("drop", Leaf)])),
        ]),
    ),
    ("restartPolicy", Leaf),
]);

const VOLUME: Shape = Object(&[
    ("name", Leaf),
    ("emptyDir", Object(&[("medium", Leaf), ("sizeLimit", Leaf)])),
    ("hostPath", Object(&[("path", Leaf), ("type", Leaf)])),
]);

const POD: Shape = Object(&[
    ("apiVersion", Leaf),
    ("kind", Leaf),
    (
        "metadata",
        Object(&[
            ("name", Leaf),
            ("namespace", Leaf),
            ("uid", Leaf),
            ("labels", Leaf),
            ("annotations", Leaf),
            ("creationTimestamp", Leaf),
        ]),
    ),
    (
        "spec",
        Object(&[
            ("initContainers", List(&CONTAINER)),
            ("containers", List(&CONTAINER)),
            ("volumes", List(&VOLUME)),
            ("restartPolicy", Leaf),
            ("activeDeadlineSeconds", Leaf),
            ("terminationGracePeriodSeconds", Leaf),
            ("shareProcessNamespace", Leaf),
            ("hostNetwork", Leaf),
        ]),
    ),
    // What `kubectl get -o yaml` adds; it describes a past run and is ignored.
    ("status", Leaf),
]);

/// Refuse the first field outside `shape`, naming it by its path (`spec.containers[0].ports`).
fn check(value: &Value, shape: &Shape, path: &str) -> Result<(), WorkflowError> {
    match (shape, value) {
        (_, Value::Null) | (Leaf, _) => Ok(()),
        (Object(fields), Value::Object(map)) => {
            for (k, v) in map {
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match fields.iter().find(|(name, _)| name == k) {
                    Some((_, s)) => check(v, s, &child)?,
                    None => return Err(WorkflowError::Unsupported(child)),
                }
            }
            Ok(())
        }
        (List(item), Value::Array(items)) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| check(v, item, &format!("{path}[{i}]"))),
        (Object(_), _) => Err(WorkflowError::Invalid(format!("{path} must be an object"))),
        (List(_), _) => Err(WorkflowError::Invalid(format!("{path} must be a list"))),
    }
}

/// What a container is to the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    /// Runs to completion before the next one starts.
    Init,
    /// An init container with `restartPolicy: Always`: started in init order, kept running, and
    /// stopped after the main work.
    NativeSidecar,
    /// Main work: the run ends when every main container has exited.
    Main,
    /// Runs beside the main work and is stopped when it is done.
    Sidecar,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Never,
    OnFailure,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    EmptyDir { memory: bool },
    HostPath { path: PathBuf, kind: String },
}

#[derive(Debug, Clone)]
pub struct Volume {
    pub name: String,
    pub source: VolumeSource,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub name: String,
    pub container: String,
    pub path: String,
}

#[derive(Debug, Clone)]
pub struct Step {
    pub role: Role,
    pub container: Container,
}

/// A validated run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Init containers and native sidecars, in order.
    pub init: Vec<Step>,
    /// Main containers and sidecars.
    pub containers: Vec<Step>,
    pub volumes: Vec<Volume>,
    pub restart: RestartPolicy,
    pub deadline: Option<Duration>,
    pub grace: Duration,
    pub share_pid: bool,
    pub host_network: bool,
    pub outputs: Vec<Output>,
}

impl Plan {
    pub fn steps(&self) -> impl Iterator<Item = &Step> {
        self.init.iter().chain(&self.containers)
    }
}

/// Parse a manifest (YAML or JSON, which is YAML too) into a plan.
pub fn parse(text: &str) -> Result<Plan, WorkflowError> {
    let value: Value = serde_yaml::from_str(text)
        .map_err(|e| WorkflowError::Invalid(format!("not a YAML or JSON document: {e}")))?;
    if !value.is_object() {
        return Err(WorkflowError::Invalid(
            "the manifest must be a Pod object".into(),
        ));
    }
    match value.get("kind").and_then(Value::as_str) {
        Some("Pod") => {}
        Some(other) => {
            return Err(WorkflowError::Invalid(format!(
                "kind {other:?} is not supported: the manifest must be a Pod"
            )))
        }
        None => return Err(WorkflowError::Invalid("kind: Pod is missing".into())),
    }
    check(&value, &POD, "")?;
    let pod: Pod = serde_json::from_value(value)
        .map_err(|e| WorkflowError::Invalid(format!("not a valid Pod: {e}")))?;
    plan(pod)
}

fn invalid(msg: impl Into<String>) -> WorkflowError {
    WorkflowError::Invalid(msg.into())
}

/// A DNS-1123 label, as Kubernetes requires of container and volume names: at most 63 lowercase
/// letters, digits and `-`, starting and ending with a letter or digit. Such a name is one plain
/// path component (an emptyDir's directory, a log file's name) and holds no `:` or `/`.
fn check_label(field: &str, name: &str) -> Result<(), WorkflowError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        return Ok(());
    }
    Err(invalid(format!(
        "{field} {:?} is not a DNS-1123 label (at most 63 lowercase letters, digits and '-', \
         starting and ending with a letter or digit)",
        crishim_sys::shown::shown(name)
    )))
}

/// `metadata.uid` names the run's directory: one plain path component of letters, digits, `-`,
/// `_` and `.` (a UUID is one), neither `.` nor `..`.
fn check_uid(uid: &str) -> Result<(), WorkflowError> {
    let ok = uid.len() <= 128
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && uid != "."
        && uid != "..";
    if ok {
        return Ok(());
    }
    Err(invalid(format!(
        "metadata.uid {:?} is not a plain identifier (at most 128 letters, digits, '-', '_' and \
         '.'; a UUID is one)",
        crishim_sys::shown::shown(uid)
    )))
}

fn plan(pod: Pod) -> Result<Plan, WorkflowError> {
    let meta = pod.metadata;
    let name = meta
        .name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| invalid("metadata.name is required"))?;
    let annotations = meta.annotations.unwrap_or_default();
    let spec = pod.spec.ok_or_else(|| invalid("spec is required"))?;

    let restart = match spec.restart_policy.as_deref() {
        None | Some("Never") => RestartPolicy::Never,
        Some("OnFailure") => RestartPolicy::OnFailure,
        Some(other) => {
            return Err(invalid(format!(
                "spec.restartPolicy {other:?} is not supported: a run takes Never or OnFailure"
            )))
        }
    };

    let volumes = spec
        .volumes
        .unwrap_or_default()
        .into_iter()
        .map(volume)
        .collect::<Result<Vec<_>, _>>()?;
    let mut volume_names = HashSet::new();
    for (i, v) in volumes.iter().enumerate() {
        check_label(&format!("spec.volumes[{i}].name"), &v.name)?;
        if !volume_names.insert(v.name.clone()) {
            return Err(invalid(format!("volume {:?} is declared twice", v.name)));
        }
    }

    let sidecar_names: Option<Vec<String>> = annotations.get(SIDECARS_ANNOTATION).map(|s| {
        s.split(',')
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect()
    });
    let containers = spec.containers;
    if containers.is_empty() {
        return Err(invalid("spec.containers must name at least one container"));
    }
    let has_main = containers.iter().any(|c| c.name == "main");
    let containers: Vec<Step> = containers
        .into_iter()
        .map(|c| {
            let sidecar = match &sidecar_names {
                Some(names) => names.contains(&c.name),
                None => has_main && c.name != "main",
            };
            let role = if sidecar { Role::Sidecar } else { Role::Main };
            Step { role, container: c }
        })
        .collect();
    if let Some(names) = &sidecar_names {
        for n in names {
            if !containers.iter().any(|s| &s.container.name == n) {
                return Err(invalid(format!(
                    "annotation {SIDECARS_ANNOTATION} names {n:?}, which is not in spec.containers"
                )));
            }
        }
    }
    if !containers.iter().any(|s| s.role == Role::Main) {
        return Err(invalid(format!(
            "every container is a sidecar ({SIDECARS_ANNOTATION}); a run needs main work"
        )));
    }
    let init = spec
        .init_containers
        .unwrap_or_default()
        .into_iter()
        .map(|c| match c.restart_policy.as_deref() {
            None => Ok(Step {
                role: Role::Init,
                container: c,
            }),
            Some("Always") => Ok(Step {
                role: Role::NativeSidecar,
                container: c,
            }),
            Some(other) => Err(invalid(format!(
                "init container {:?}: restartPolicy {other:?} is not supported (only Always, for \
                 a native sidecar)",
                c.name
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;

    let mut names = HashSet::new();
    for s in init.iter().chain(&containers) {
        let c = &s.container;
        if c.name.is_empty() {
            return Err(invalid("every container needs a name"));
        }
        let field = match s.role {
            Role::Init | Role::NativeSidecar => "init container name",
            _ => "container name",
        };
        check_label(field, &c.name)?;
        if !names.insert(c.name.clone()) {
            return Err(invalid(format!(
                "container name {:?} is used twice",
                c.name
            )));
        }
        if c.image.as_deref().unwrap_or_default().is_empty() {
            return Err(invalid(format!("container {:?} has no image", c.name)));
        }
        if s.role != Role::NativeSidecar && s.role != Role::Init && c.restart_policy.is_some() {
            return Err(invalid(format!(
                "container {:?}: restartPolicy is only supported on init containers",
                c.name
            )));
        }
        for m in c.volume_mounts.iter().flatten() {
            if !volume_names.contains(&m.name) {
                return Err(invalid(format!(
                    "container {:?} mounts volume {:?}, which spec.volumes does not declare",
                    c.name, m.name
                )));
            }
            if !m.mount_path.starts_with('/') {
                return Err(invalid(format!(
                    "container {:?}: mountPath {:?} must be absolute",
                    c.name, m.mount_path
                )));
            }
            if m.sub_path
                .as_deref()
                .is_some_and(|p| p.starts_with('/') || p.split('/').any(|c| c == ".."))
            {
                return Err(invalid(format!(
                    "container {:?}: subPath {:?} must be a relative path without ..",
                    c.name,
                    m.sub_path.as_deref().unwrap_or_default()
                )));
            }
        }
        super::resources::resources(c)?;
    }

    let outputs = annotations
        .iter()
        .filter_map(|(k, v)| k.strip_prefix(OUTPUT_PREFIX).map(|n| (n, v)))
        .map(|(name, v)| {
            let (container, path) = v.split_once(':').ok_or_else(|| {
                invalid(format!(
                    "annotation {OUTPUT_PREFIX}{name}: {v:?} is not <container>:<path>"
                ))
            })?;
            if name.is_empty() || !names.contains(container) || !path.starts_with('/') {
                return Err(invalid(format!(
                    "annotation {OUTPUT_PREFIX}{name}: {v:?} must name a container of the pod \
                     and an absolute path"
                )));
            }
            Ok(Output {
                name: name.to_string(),
                container: container.to_string(),
                path: path.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;

    let seconds = |v: Option<i64>, field: &str| -> Result<Option<Duration>, WorkflowError> {
        match v {
            Some(s) if s < 0 => Err(invalid(format!("spec.{field} must not be negative"))),
            Some(s) => Ok(Some(crishim_cri::bounds::request_secs(s))),
            None => Ok(None),
        }
    };
    let deadline = seconds(spec.active_deadline_seconds, "activeDeadlineSeconds")?;
    let grace = seconds(
        spec.termination_grace_period_seconds,
        "terminationGracePeriodSeconds",
    )?
    .unwrap_or(Duration::from_secs(30));

    Ok(Plan {
        namespace: meta
            .namespace
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into()),
        uid: match meta.uid.filter(|u| !u.is_empty()) {
            Some(uid) => {
                check_uid(&uid)?;
                uid
            }
            None => crishim_state::records::new_id()
                .map_err(|e| WorkflowError::Setup(format!("generating the pod's uid: {e}")))?,
        },
        labels: meta.labels.unwrap_or_default(),
        annotations,
        name,
        init,
        containers,
        volumes,
        restart,
        deadline,
        grace,
        share_pid: spec.share_process_namespace.unwrap_or(false),
        host_network: spec.host_network.unwrap_or(false),
        outputs,
    })
}

fn volume(v: k8s_openapi::api::core::v1::Volume) -> Result<Volume, WorkflowError> {
    let source = match (v.empty_dir, v.host_path) {
        (Some(e), None) => match e.medium.as_deref() {
            None | Some("") => VolumeSource::EmptyDir { memory: false },
            Some("Memory") => VolumeSource::EmptyDir { memory: true },
            Some(other) => {
                return Err(invalid(format!(
                    "volume {:?}: emptyDir medium {other:?} is not supported",
                    v.name
                )))
            }
        },
        (None, Some(h)) => {
            let kind = h.type_.unwrap_or_default();
            if !["", "Directory", "DirectoryOrCreate", "File", "FileOrCreate"]
                .contains(&kind.as_str())
            {
                return Err(invalid(format!(
                    "volume {:?}: hostPath type {kind:?} is not supported",
                    v.name
                )));
            }
            if !h.path.starts_with('/') {
                return Err(invalid(format!(
                    "volume {:?}: hostPath path {:?} must be absolute",
                    v.name, h.path
                )));
            }
            VolumeSource::HostPath {
                path: PathBuf::from(h.path),
                kind,
            }
        }
        _ => {
            return Err(invalid(format!(
                "volume {:?} must have exactly one of emptyDir and hostPath",
                v.name
            )))
        }
    };
    Ok(Volume {
        name: v.name,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORKFLOW: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: wf
  annotations:
    crishim.io/outputs.result: main:/shared/out.txt
spec:
  restartPolicy: Never
  volumes:
  - name: shared
    emptyDir: {}
  initContainers:
  - name: prepare
    image: busybox
    command: [sh, -c, "echo hi > /shared/input"]
    volumeMounts: [{name: shared, mountPath: /shared}]
  - name: proxy
    image: busybox
    restartPolicy: Always
  containers:
  - name: main
    image: busybox
    resources: {limits: {cpu: 500m, memory: 64Mi}}
    volumeMounts: [{name: shared, mountPath: /shared}]
  - name: logger
    image: busybox
"#;

    #[test]
    fn a_workflow_pod_becomes_a_plan() {
        let p = parse(WORKFLOW).unwrap();
        assert_eq!(p.name, "wf");
        assert_eq!(p.namespace, "default");
        let roles: Vec<_> = p
            .steps()
            .map(|s| (s.container.name.as_str(), s.role))
            .collect();
        assert_eq!(
            roles,
            [
                ("prepare", Role::Init),
                ("proxy", Role::NativeSidecar),
                ("main", Role::Main),
                ("logger", Role::Sidecar)
            ]
        );
        assert_eq!(
            p.outputs,
            [Output {
                name: "result".into(),
                container: "main".into(),
                path: "/shared/out.txt".into()
            }]
        );
        assert_eq!(p.grace, Duration::from_secs(30));
        assert_eq!(p.restart, RestartPolicy::Never);
    }

    #[test]
    fn unsupported_fields_are_refused_by_name() {
        let text = WORKFLOW.replace(
            "  - name: logger\n",
            "  - name: logger\n    livenessProbe: {exec: {command: [true]}}\n",
        );
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("spec.containers[1].livenessProbe"), "{e}");
        let text = WORKFLOW.replace("  restartPolicy: Never\n", "  nodeName: n1\n");
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("spec.nodeName"), "{e}");
        let text = WORKFLOW.replace("    emptyDir: {}", "    configMap: {name: x}");
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("spec.volumes[0].configMap"), "{e}");
    }

    /// Volume and container names become paths (an emptyDir's directory under the run's, log
    /// files) and annotation values: each must be a DNS-1123 label, and `metadata.uid` (the run's
    /// directory) one plain component; the error names the field and the value.
    #[test]
    fn names_that_would_leave_the_run_directory_are_refused() {
        let pod = |containers: &str, volumes: &str, uid: &str| {
            format!(
                "kind: Pod\nmetadata: {{name: x{uid}}}\nspec: {{containers: [{containers}], \
                 volumes: [{volumes}]}}"
            )
        };
        let ok_c = "{name: main, image: b}";
        for (text, field, value) in [
            (
                pod(ok_c, "{name: ../../../../x, emptyDir: {}}", ""),
                "spec.volumes[0].name",
                "../../../../x",
            ),
            (
                pod(
                    ok_c,
                    "{name: a, emptyDir: {}}, {name: Big, emptyDir: {}}",
                    "",
                ),
                "spec.volumes[1].name",
                "Big",
            ),
            (
                pod("{name: a/b, image: b}", "", ""),
                "container name",
                "a/b",
            ),
            (
                pod("{name: 'a:b', image: b}", "", ""),
                "container name",
                "a:b",
            ),
            (pod("{name: -a, image: b}", "", ""), "container name", "-a"),
            (
                format!(
                    "kind: Pod\nmetadata: {{name: x}}\nspec: {{initContainers: [{{name: .., \
                     image: b}}], containers: [{ok_c}]}}"
                ),
                "init container name",
                "..",
            ),
            (
                pod(ok_c, "", ", uid: ../../../etc"),
                "metadata.uid",
                "../../../etc",
            ),
        ] {
            let e = parse(&text).unwrap_err().to_string();
            assert!(
                e.contains(field) && e.contains(&format!("{value:?}")),
                "{text:?}: {e}"
            );
        }
        let long = "a".repeat(64);
        let e = parse(&pod(&format!("{{name: {long}, image: b}}"), "", ""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("DNS-1123"), "{e}");
        let plan = parse(&pod(
            "{name: main, image: b}, {name: side-car-2, image: b}",
            "{name: scratch-1, emptyDir: {}}",
            ", uid: 0b6f5a3e-8d1c-4c7e-9f55-1d2a3b4c5d6e",
        ))
        .unwrap();
        assert_eq!(plan.uid, "0b6f5a3e-8d1c-4c7e-9f55-1d2a3b4c5d6e");
    }

    #[test]
    fn bad_manifests_are_refused_with_a_reason() {
        for (text, want) in [
            ("{", "not a YAML or JSON"),
            ("kind: Deployment", "Deployment"),
            ("kind: Pod\nmetadata: {name: x}\nspec: {containers: []}", "at least one"),
            (
                "kind: Pod\nmetadata: {name: x}\nspec: {restartPolicy: Always, containers: [{name: a, image: b}]}",
                "restartPolicy \"Always\"",
            ),
            (
                "kind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a}]}",
                "has no image",
            ),
            (
                "kind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a, image: b, volumeMounts: [{name: v, mountPath: /v}]}]}",
                "does not declare",
            ),
            (
                "kind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a, image: b, resources: {limits: {memory: lots}}}]}",
                "lots",
            ),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
