//! Invocation tests with shell-script plugins that record each call (its environment and
//! stdin) and print what the test tells them to. The real plugins are exercised by
//! `tests/tests/cni.rs`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::*;

struct Fake {
    _dir: tempfile::TempDir,
    bin: PathBuf,
    conf: PathBuf,
    cache: PathBuf,
    calls: PathBuf,
}

#[derive(Debug)]
struct Call {
    plugin: String,
    command: String,
    env: BTreeMap<String, String>,
    stdin: Value,
}

/// An ADD that prints a 1.0.0 result with `ip` on eth0.
fn add_result(ip: &str) -> String {
    let r = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": "/proc/self/ns/net"}],
        "ips": [{"address": format!("{ip}/24"), "gateway": "10.9.0.1", "interface": 0}]
    });
    format!("printf '%s' '{r}'")
}

fn fail_json(code: u32, msg: &str) -> String {
    let e = json!({"cniVersion": "1.0.0", "code": code, "msg": msg, "details": "some details"});
    format!("printf '%s' '{e}'; exit 1")
}

impl Fake {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let f = Fake {
            bin: dir.path().join("bin"),
            conf: dir.path().join("net.d"),
            cache: dir.path().join("cache"),
            calls: dir.path().join("calls"),
            _dir: dir,
        };
        std::fs::create_dir(&f.bin).unwrap();
        std::fs::create_dir(&f.conf).unwrap();
        std::fs::create_dir(&f.calls).unwrap();
        f
    }

    /// A plugin `name` that records its call, then runs `add`/`del`/`check` (sh) for the
    /// command (default: exit 0 silently).
    fn plugin(&self, name: &str, add: &str, del: &str, check: &str) {
        let calls = self.calls.display();
        let script = format!(
            "#!/bin/sh\nstdin=$(cat)\nn=$(ls {calls} | wc -l)\nmkdir {calls}/$n\n\
             env > {calls}/$n/env\nprintf '%s' \"$stdin\" > {calls}/$n/stdin\n\
             echo {name} > {calls}/$n/plugin\necho $$ > {calls}/$n/pid\n\
             case \"$CNI_COMMAND\" in\nADD) {add} ;;\nDEL) {del} ;;\nCHECK) {check} ;;\nesac\n\
             exit 0\n"
        );
        let path = self.bin.join(name);
        std::fs::write(&path, script).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn conflist(&self, file: &str, v: Value) {
        std::fs::write(self.conf.join(file), v.to_string()).unwrap();
    }

    fn cni(&self) -> Cni {
        let mut c = CniConfig::new(
            self.conf.clone(),
            vec![self.dir_missing(), self.bin.clone()],
            self.cache.clone(),
        );
        c.timeout = Duration::from_secs(10);
        Cni::new(c)
    }

    fn dir_missing(&self) -> PathBuf {
        self.bin.with_file_name("no-such-bin")
    }

    fn calls(&self) -> Vec<Call> {
        let n = std::fs::read_dir(&self.calls).unwrap().count();
        (0..n)
            .map(|i| {
                let d = self.calls.join(i.to_string());
                let read = |f: &str| std::fs::read_to_string(d.join(f)).unwrap();
                let env = read("env")
                    .lines()
                    .filter_map(|l| l.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>();
                Call {
                    plugin: read("plugin").trim().to_string(),
                    command: env.get("CNI_COMMAND").cloned().unwrap_or_default(),
                    stdin: serde_json::from_str(&read("stdin")).unwrap(),
                    env,
                }
            })
            .collect()
    }

    fn clear_calls(&self) {
        std::fs::remove_dir_all(&self.calls).unwrap();
        std::fs::create_dir(&self.calls).unwrap();
    }

    /// Whether the cache holds an entry for `id`, as a daemon opening it now would find it.
    fn cached(&self, id: &str) -> bool {
        cache::Cache::new(self.cache.clone())
            .load(id)
            .unwrap()
            .is_some()
    }
}

fn seq(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .map(|c| format!("{} {}", c.plugin, c.command))
        .collect()
}

fn pod(id: &str) -> PodNetwork {
    PodNetwork {
        id: id.to_string(),
        netns: "/proc/self/ns/net".into(),
        ifname: String::new(),
        name: "web".into(),
        namespace: "default".into(),
        uid: "uid-1".into(),
        port_mappings: vec![
            PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: "TCP".into(),
                host_ip: String::new(),
            },
            PortMapping {
                host_port: 0,
                container_port: 81,
                protocol: "tcp".into(),
                host_ip: String::new(),
            },
        ],
        dns: Some(Dns {
            servers: vec!["10.96.0.10".into()],
            searches: vec!["svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        }),
        capability_args: BTreeMap::new(),
    }
}

fn three_plugins(version: &str) -> Value {
    json!({
        "cniVersion": version, "name": "fakenet",
        "plugins": [
            {"type": "a", "opt": 1},
            {"type": "b", "capabilities": {"portMappings": true}},
            {"type": "c", "capabilities": {"dns": true, "portMappings": false}}
        ]
    })
}

#[test]
fn cni_args_and_capabilities() {
    let p = pod("sandbox1");
    assert_eq!(
        p.cni_args(),
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;\
         K8S_POD_INFRA_CONTAINER_ID=sandbox1;K8S_POD_UID=uid-1"
    );
    assert_eq!(p.ifname(), "eth0");
    let mut p2 = p.clone();
    p2.port_mappings[0].host_ip = "127.0.0.1".into();
    p2.capability_args
        .insert("bandwidth".into(), json!({"ingressRate": 1}));
    let caps = p2.runtime_capabilities();
    assert_eq!(
        caps["portMappings"],
        json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "127.0.0.1"}])
    );
    assert_eq!(
        caps["dns"],
        json!({"servers": ["10.96.0.10"], "searches": ["svc.cluster.local"], "options": ["ndots:5"]})
    );
    assert_eq!(caps["bandwidth"], json!({"ingressRate": 1}));
    let bare = PodNetwork {
        id: "x".into(),
        ..Default::default()
    };
    assert!(bare.runtime_capabilities().is_empty());
}

#[tokio::test]
async fn cni_add_chains_prev_result_and_del_runs_in_reverse_with_cached_result() {
    let f = Fake::new();
    f.plugin("a", &add_result("10.9.0.2"), "", "");
    f.plugin("b", &add_result("10.9.0.3"), "", "");
    f.plugin("c", "", "", ""); // prints nothing: b's result stands
    f.conflist("10-fake.conflist", three_plugins("1.0.0"));
    let cni = f.cni();
    assert_eq!(cni.ready(), Ok(()));
    let p = pod("sandbox1");
    let r = cni.setup(&p).await.unwrap();
    assert_eq!(r.pod_ip(), Some("10.9.0.3".parse().unwrap()));
    assert_eq!(r.cni_version, "1.0.0");

    let calls = f.calls();
    assert_eq!(seq(&calls), ["a ADD", "b ADD", "c ADD"]);
    let a_out: Value = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": "/proc/self/ns/net"}],
        "ips": [{"address": "10.9.0.2/24", "gateway": "10.9.0.1", "interface": 0}]
    });
    assert_eq!(
        calls[0].stdin,
        json!({"type": "a", "opt": 1, "name": "fakenet", "cniVersion": "1.0.0"})
    );
    assert_eq!(calls[1].stdin["prevResult"], a_out);
    assert_eq!(
        calls[1].stdin["runtimeConfig"],
        json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
    );
    assert_eq!(calls[2].stdin["prevResult"], r.raw);
    assert_eq!(
        calls[2].stdin["runtimeConfig"],
        json!({"dns": {"servers": ["10.96.0.10"], "searches": ["svc.cluster.local"], "options": ["ndots:5"]}})
    );
    for c in &calls {
        let cni_vars: BTreeMap<String, String> = c
            .env
            .iter()
            .filter(|(k, _)| k.starts_with("CNI_"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let want: BTreeMap<String, String> = [
            ("CNI_COMMAND", "ADD".to_string()),
            ("CNI_CONTAINERID", "sandbox1".to_string()),
            ("CNI_NETNS", "/proc/self/ns/net".to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_ARGS", p.cni_args()),
            (
                "CNI_PATH",
                format!("{}:{}", f.dir_missing().display(), f.bin.display()),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(cni_vars, want);
        // Go's scheduler sized to one CPU: plugins are short-lived and do one thing at a time.
        assert_eq!(c.env["GOMAXPROCS"], "1");
        // Nothing of the daemon's environment but PATH (sh adds PWD and the like).
        let others: Vec<_> = c
            .env
            .keys()
            .filter(|k| {
                !k.starts_with("CNI_")
                    && !["PATH", "GOMAXPROCS", "PWD", "SHLVL", "_", "OLDPWD"].contains(&k.as_str())
            })
            .collect();
        assert!(others.is_empty(), "leaked environment: {others:?}");
        assert!(c.env["PATH"].split(':').any(|d| d == "/usr/sbin"));
    }

    // The cache has the config and the result.
    let cached = cni.cache().load("sandbox1").unwrap().unwrap();
    assert_eq!(cached.result.as_ref(), Some(&r.raw));
    assert_eq!(cached.config, three_plugins("1.0.0"));
    assert_eq!(cni.cached_result("sandbox1").unwrap(), Some(r.clone()));

    f.clear_calls();
    cni.check(&p).await.unwrap();
    let calls = f.calls();
    assert_eq!(seq(&calls), ["a CHECK", "b CHECK", "c CHECK"]);
    assert!(calls.iter().all(|c| c.stdin["prevResult"] == r.raw));

    f.clear_calls();
    cni.teardown(&p).await.unwrap();
    let calls = f.calls();
    assert_eq!(seq(&calls), ["c DEL", "b DEL", "a DEL"]);
    for c in &calls {
        assert_eq!(c.stdin["prevResult"], r.raw, "{}", c.plugin);
        assert_eq!(c.env["CNI_NETNS"], "/proc/self/ns/net");
        assert_eq!(c.env["CNI_CONTAINERID"], "sandbox1");
    }
    assert_eq!(
        calls[1].stdin["runtimeConfig"],
        json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
    );
    assert!(!f.cached("sandbox1"));
    assert_eq!(cni.cached_result("sandbox1").unwrap(), None);
    // DEL again (nothing cached): the current config, no prevResult; still fine.
    f.clear_calls();
    cni.teardown(&p).await.unwrap();
    let calls = f.calls();
    assert_eq!(seq(&calls), ["c DEL", "b DEL", "a DEL"]);
    assert!(calls.iter().all(|c| c.stdin.get("prevResult").is_none()));
}

#[tokio::test]
async fn cni_failed_add_is_undone_and_names_the_plugin() {
    let f = Fake::new();
    f.plugin("a", &add_result("10.9.0.2"), "", "");
    f.plugin("b", &fail_json(11, "no more addresses"), "", "");
    f.plugin("c", "", "", "");
    f.conflist("10-fake.conflist", three_plugins("1.0.0"));
    let cni = f.cni();
    let err = cni.setup(&pod("sb")).await.unwrap_err();
    match &err {
        CniError::Plugin {
            plugin,
            command,
            code,
            msg,
            details,
        } => {
            assert_eq!(plugin, "b");
            assert_eq!(command, "ADD");
            assert_eq!(*code, Some(11));
            assert_eq!(msg, "no more addresses");
            assert_eq!(details, "some details");
        }
        e => panic!("{e:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("CNI plugin b ADD failed") && text.contains("no more addresses"),
        "{text}"
    );
    let calls = f.calls();
    assert_eq!(seq(&calls), ["a ADD", "b ADD", "c DEL", "b DEL", "a DEL"]);
    // The undo gets what ADD had produced so far.
    assert_eq!(
        calls[4].stdin["prevResult"]["ips"][0]["address"],
        "10.9.0.2/24"
    );
    assert!(!f.cached("sb"));
}

#[tokio::test]
async fn cni_failed_undo_keeps_the_cache_for_teardown() {
    let f = Fake::new();
    f.plugin(
        "a",
        &add_result("10.9.0.2"),
        "echo a-del-broken >&2; exit 1",
        "",
    );
    f.plugin("b", "echo b-add-broken >&2; exit 1", "", "");
    f.plugin("c", "", "", "");
    f.conflist("10-fake.conflist", three_plugins("1.0.0"));
    let cni = f.cni();
    let err = cni.setup(&pod("sb")).await.unwrap_err();
    assert!(
        matches!(&err, CniError::Plugin { plugin, msg, code: None, .. } if plugin == "b" && msg == "b-add-broken"),
        "{err:?}"
    );
    let cached = cni.cache().load("sb").unwrap().unwrap();
    assert_eq!(cached.result, None);
    // A later teardown retries with the cached config.
    f.plugin("a", "", "", "");
    std::fs::remove_file(f.conf.join("10-fake.conflist")).unwrap();
    f.clear_calls();
    cni.teardown(&pod("sb")).await.unwrap();
    assert_eq!(seq(&f.calls()), ["c DEL", "b DEL", "a DEL"]);
    assert!(!f.cached("sb"));
}

#[tokio::test]
async fn cni_del_runs_every_plugin_and_aggregates_errors() {
    let f = Fake::new();
    f.plugin(
        "a",
        &add_result("10.9.0.2"),
        "echo a-del-failed >&2; exit 1",
        "",
    );
    f.plugin("b", "", &fail_json(5, "b-del-failed"), "");
    f.plugin("c", "", "", "");
    f.conflist("10-fake.conflist", three_plugins("0.4.0"));
    let cni = f.cni();
    cni.setup(&pod("sb")).await.unwrap();
    f.clear_calls();
    let err = cni.teardown(&pod("sb")).await.unwrap_err();
    assert_eq!(seq(&f.calls()), ["c DEL", "b DEL", "a DEL"]);
    let CniError::Multiple(errors) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(errors.len(), 2);
    let text = err.to_string();
    assert!(
        text.contains("CNI plugin b DEL failed (code 5): b-del-failed"),
        "{text}"
    );
    assert!(
        text.contains("CNI plugin a DEL failed: a-del-failed"),
        "{text}"
    );
    assert!(f.cached("sb"), "kept for a retry");
    // A plugin that is gone is reported, the others still run.
    std::fs::remove_file(f.bin.join("b")).unwrap();
    f.plugin("a", "", "", "");
    f.clear_calls();
    let err = cni.teardown(&pod("sb")).await.unwrap_err();
    assert!(
        matches!(&err, CniError::PluginNotFound { plugin, .. } if plugin == "b"),
        "{err:?}"
    );
    assert_eq!(seq(&f.calls()), ["c DEL", "a DEL"]);
}

#[tokio::test]
async fn cni_missing_plugin_fails_before_running_anything() {
    let f = Fake::new();
    f.plugin("a", &add_result("10.9.0.2"), "", "");
    f.conflist(
        "10-fake.conflist",
        json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "a"}, {"type": "nosuchplugin"}]}),
    );
    let cni = f.cni();
    let reason = cni.ready().unwrap_err();
    assert!(reason.contains("\"nosuchplugin\" not found"), "{reason}");
    let err = cni.setup(&pod("sb")).await.unwrap_err();
    assert!(matches!(&err, CniError::PluginNotFound { plugin, .. } if plugin == "nosuchplugin"));
    assert!(err.to_string().contains(&f.bin.display().to_string()));
    assert!(f.calls().is_empty());
    assert!(!f.cached("sb"));
}

#[tokio::test]
async fn cni_plugin_timeout_kills_it() {
    let f = Fake::new();
    f.plugin("a", "exec sleep 60", "", "");
    f.conflist(
        "10-fake.conflist",
        json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "a"}]}),
    );
    let mut config = f.cni().config().clone();
    config.timeout = Duration::from_millis(700);
    let cni = Cni::new(config);
    let start = Instant::now();
    let err = cni.setup(&pod("sb")).await.unwrap_err();
    assert!(
        matches!(&err, CniError::Timeout { plugin, command, .. } if plugin == "a" && command == "ADD"),
        "{err:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    let calls = f.calls();
    assert_eq!(seq(&calls), ["a ADD", "a DEL"]);
    let pid = std::fs::read_to_string(f.calls.join("0/pid")).unwrap();
    let proc = PathBuf::from(format!("/proc/{}", pid.trim()));
    let deadline = Instant::now() + Duration::from_secs(5);
    while proc.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!proc.exists(), "the timed-out plugin was killed and reaped");
}

#[tokio::test]
async fn cni_old_versions_get_no_prev_result_on_del_and_skip_check() {
    let f = Fake::new();
    f.plugin("a", &add_result("10.9.0.2"), "", "exit 1");
    f.plugin("b", "", "", "exit 1");
    f.plugin("c", "", "", "exit 1");
    f.conflist("10-fake.conflist", three_plugins("0.3.1"));
    let cni = f.cni();
    let p = pod("sb");
    cni.setup(&p).await.unwrap();
    cni.check(&p).await.unwrap();
    f.clear_calls();
    cni.teardown(&p).await.unwrap();
    let calls = f.calls();
    assert_eq!(seq(&calls), ["c DEL", "b DEL", "a DEL"]);
    assert!(calls.iter().all(|c| c.stdin.get("prevResult").is_none()));
    // disableCheck on 1.0.0
    let mut list = three_plugins("1.0.0");
    list["disableCheck"] = json!(true);
    f.conflist("10-fake.conflist", list);
    cni.setup(&p).await.unwrap();
    f.clear_calls();
    cni.check(&p).await.unwrap();
    assert!(f.calls().is_empty());
    // Nothing cached: CHECK is an error.
    cni.teardown(&p).await.unwrap();
    assert!(matches!(
        cni.check(&p).await,
        Err(CniError::InvalidRequest(_))
    ));
}

#[tokio::test]
async fn cni_teardown_uses_the_cached_config_and_missing_netns_is_empty() {
    let f = Fake::new();
    f.plugin("a", &add_result("10.9.0.2"), "", "");
    f.plugin("b", "", "", "");
    f.plugin("z", "", "", "");
    f.conflist(
        "10-one.conflist",
        json!({"cniVersion": "1.0.0", "name": "one", "plugins": [{"type": "a"}, {"type": "b"}]}),
    );
    let cni = f.cni();
    let mut p = pod("sb");
    p.ifname = "net1".into();
    cni.setup(&p).await.unwrap();
    // The conf dir changes: a new first file.
    f.conflist(
        "00-two.conflist",
        json!({"cniVersion": "1.0.0", "name": "two", "plugins": [{"type": "z"}]}),
    );
    f.clear_calls();
    let mut later = pod("sb");
    later.netns = f.conf.join("gone"); // no such file any more
    later.port_mappings.clear();
    cni.teardown(&later).await.unwrap();
    let calls = f.calls();
    assert_eq!(seq(&calls), ["b DEL", "a DEL"]);
    for c in &calls {
        assert_eq!(c.stdin["name"], "one");
        assert_eq!(c.env["CNI_NETNS"], "");
        assert_eq!(c.env["CNI_IFNAME"], "net1", "the cached interface");
    }
    // Without a cache entry, the current config.
    f.clear_calls();
    cni.teardown(&later).await.unwrap();
    assert_eq!(seq(&f.calls()), ["z DEL"]);
}

#[tokio::test]
async fn cni_ready_follows_the_conf_dir_and_conf_files_are_wrapped() {
    let f = Fake::new();
    f.plugin("a", &add_result("10.9.0.7"), "", "");
    std::fs::remove_dir(&f.conf).unwrap();
    let cni = f.cni();
    assert!(cni
        .ready()
        .unwrap_err()
        .contains("cannot read CNI config dir"));
    assert!(matches!(
        cni.setup(&pod("sb")).await,
        Err(CniError::NoConfig(_))
    ));
    std::fs::create_dir(&f.conf).unwrap();
    assert!(cni.ready().unwrap_err().contains("no network config found"));
    let conf = json!({"cniVersion": "0.4.0", "name": "single", "type": "a", "x": [1]});
    f.conflist("05-single.conf", conf.clone());
    assert_eq!(cni.ready(), Ok(()));
    let r = cni.setup(&pod("sb")).await.unwrap();
    assert_eq!(r.ips, vec!["10.9.0.7".parse::<std::net::IpAddr>().unwrap()]);
    assert_eq!(f.calls()[0].stdin, conf);
}

#[tokio::test]
async fn cni_bad_requests_and_results() {
    let f = Fake::new();
    f.plugin("a", "printf 'not json'", "", "");
    f.conflist(
        "10-fake.conflist",
        json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "a"}]}),
    );
    let cni = f.cni();
    for id in ["", "..", "a/b", ".hidden"] {
        let err = cni.setup(&pod(id)).await.unwrap_err();
        assert!(
            matches!(err, CniError::InvalidRequest(_)),
            "{id:?}: {err:?}"
        );
    }
    let mut no_ns = pod("sb");
    no_ns.netns = PathBuf::new();
    assert!(matches!(
        cni.setup(&no_ns).await,
        Err(CniError::InvalidRequest(_))
    ));
    let err = cni.setup(&pod("sb")).await.unwrap_err();
    assert!(
        matches!(&err, CniError::BadResult(m) if m.contains("not json")),
        "{err:?}"
    );
    assert_eq!(seq(&f.calls()), ["a ADD", "a DEL"]);
    assert!(!f.cached("sb"));
}
