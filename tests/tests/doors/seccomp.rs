//! Seccomp: the container's own program, under the profile its pod asked for, whichever runtime
//! runs it. The bundle's `config.json` says what every runtime reads; `SCMP_CMP_MASKED_EQ` means
//! `(arg & value) == valueTwo` there (the OCI runtime spec, runc, containerd). libcontainer reads
//! the two the other way round, so a rule written for one runtime was an unconditional allow
//! under the other: under handler `runc`, RuntimeDefault let `clone(CLONE_NEWUSER|CLONE_NEWNET)`
//! through.
//!
//! The attacker controls the container's program (here a static C probe of the calls the
//! profile gates) and, with a Localhost profile, a profile written the OCI way. crishim trusts
//! neither: the same calls must get the same answers under the built-in runtime and under runc,
//! and the clone(2) namespace flags must be refused.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crishim_proto::cri;
use crishim_tests::image::{busybox_entries, Compression, Image};
use crishim_tests::pods::{
    assert_no_leaks, container_security, wait_for_log_line, PodEnv, PodTraces,
};
use crishim_tests::DaemonOptions;

use cri::security_profile::ProfileType;

const RUNC: &str = "/usr/sbin/runc";
const WAIT: Duration = Duration::from_secs(30);

/// One line per call: `<name>: ok` or `<name>: <errno name>`. Each call runs in a forked child
/// (its errno is the exit code), so that what a call changes (a namespace, a persona) stays
/// there; a clone's child exits at once. The arguments are chosen so that a call the filter
/// lets through gets an answer of the kernel's other than EPERM where one exists (EBADF,
/// EFAULT, ESRCH, EOPNOTSUPP).
const PROBE_C: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_clone3
#define SYS_clone3 435
#endif

struct clone3_args {
    unsigned long long flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};

/* The child of a clone: gone at once. The parent reaps it. */
static long reaped(long pid) {
    if (pid == 0)
        syscall(SYS_exit_group, 0);
    if (pid > 0)
        waitpid((pid_t)pid, NULL, __WALL);
    return pid;
}

static long call(const char *name) {
    if (!strncmp(name, "clone_", 6)) {
        unsigned long flags = 0;
        if (strstr(name, "newuser")) flags |= CLONE_NEWUSER;
        if (strstr(name, "newnet")) flags |= CLONE_NEWNET;
        if (strstr(name, "newns")) flags |= CLONE_NEWNS;
        if (strstr(name, "newpid")) flags |= CLONE_NEWPID;
        if (strstr(name, "newuts")) flags |= CLONE_NEWUTS;
        if (strstr(name, "newipc")) flags |= CLONE_NEWIPC;
        if (strstr(name, "newcgroup")) flags |= CLONE_NEWCGROUP;
        return reaped(syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0));
    }
    if (!strcmp(name, "clone3")) {
        struct clone3_args a;
        memset(&a, 0, sizeof a);
        a.flags = CLONE_NEWUSER;
        a.exit_signal = SIGCHLD;
        return reaped(syscall(SYS_clone3, &a, sizeof a));
    }
    if (!strcmp(name, "unshare")) return syscall(SYS_unshare, CLONE_NEWUSER);
    if (!strcmp(name, "setns")) return syscall(SYS_setns, -1, 0);
    if (!strcmp(name, "mount")) return syscall(SYS_mount, "none", NULL, "tmpfs", 0, NULL);
    if (!strcmp(name, "bpf")) return syscall(SYS_bpf, 0, NULL, 0);
    if (!strcmp(name, "perf_event_open"))
        return syscall(SYS_perf_event_open, NULL, 0, -1, -1, 0);
    if (!strcmp(name, "keyctl")) return syscall(SYS_keyctl, 0x7fff, 0, 0, 0, 0);
    if (!strcmp(name, "add_key")) return syscall(SYS_add_key, NULL, NULL, NULL, 0, 0);
    if (!strcmp(name, "ptrace")) return syscall(SYS_ptrace, PTRACE_PEEKDATA_, getpid(), 0, 0);
    if (!strcmp(name, "personality_refused")) return syscall(SYS_personality, 0x1234);
    if (!strcmp(name, "personality_query")) return syscall(SYS_personality, 0xffffffffUL);
    if (!strcmp(name, "kexec_load")) return syscall(SYS_kexec_load, 0, 0, NULL, 0);
    if (!strcmp(name, "open_by_handle_at"))
        return syscall(SYS_open_by_handle_at, -1, NULL, 0);
    if (!strcmp(name, "userfaultfd")) return syscall(SYS_userfaultfd, O_CLOEXEC | 1 /* USER_MODE_ONLY */);
    errno = ENOTSUP;
    return -1;
}

static const char *const CALLS[] = {
    "clone_newuser", "clone_newnet", "clone_newns", "clone_newpid", "clone_newuts",
    "clone_newipc", "clone_newcgroup", "clone_newuser_newnet", "clone3", "unshare", "setns",
    "mount", "bpf", "perf_event_open", "keyctl", "add_key", "ptrace", "personality_refused",
    "personality_query", "kexec_load", "open_by_handle_at", "userfaultfd",
};

int main(void) {
    for (size_t i = 0; i < sizeof CALLS / sizeof *CALLS; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            long r = call(CALLS[i]);
            _exit(r == -1 ? (errno & 0xff ? errno & 0xff : 255) : 0);
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) {
            printf("%s: lost (%d)\n", CALLS[i], status);
            continue;
        }
        int e = WEXITSTATUS(status);
        if (e == 0)
            printf("%s: ok\n", CALLS[i]);
        else
            printf("%s: %s\n", CALLS[i], strerrorname_np(e) ? strerrorname_np(e) : "?");
    }
    printf("probe-done\n");
    return 0;
}
"#;

/// The probe, built static with the host's gcc and glibc.
fn build_probe() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("probe.c");
    // PTRACE_PEEKDATA is 2; <sys/ptrace.h> and <linux/ptrace.h> clash.
    std::fs::write(&src, PROBE_C.replace("PTRACE_PEEKDATA_", "2")).unwrap();
    let out = dir.path().join("probe");
    let run = std::process::Command::new("gcc")
        .args(["-static", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .output()
        .expect("running gcc (hack/install-deps.sh installs gcc and libc6-dev)");
    assert!(
        run.status.success(),
        "gcc -static: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    std::fs::read(out).unwrap()
}

type Results = BTreeMap<String, String>;

/// The probe's lines, as `name -> result`.
fn parse(out: &str) -> Results {
    out.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// What containerd's RuntimeDefault profile (contrib/seccomp, which crishim's follows) answers
/// a container without CAP_SYS_ADMIN: no clone(2) namespace flag, clone3 ENOSYS (so libc falls
/// back to clone), none of the calls gated on capabilities the container lacks, ptrace allowed
/// (kernel 4.8 and later), only the listed personas, neither keyctl, add_key nor userfaultfd.
fn runtime_default_expected() -> Results {
    let mut r = Results::new();
    for flag in [
        "newuser",
        "newnet",
        "newns",
        "newpid",
        "newuts",
        "newipc",
        "newcgroup",
        "newuser_newnet",
    ] {
        r.insert(format!("clone_{flag}"), "EPERM".into());
    }
    for (k, v) in [
        ("clone3", "ENOSYS"),
        ("unshare", "EPERM"),
        ("setns", "EPERM"),
        ("mount", "EPERM"),
        ("bpf", "EPERM"),
        ("perf_event_open", "EPERM"),
        ("keyctl", "EPERM"),
        ("add_key", "EPERM"),
        ("ptrace", "ESRCH"),
        ("personality_refused", "EPERM"),
        ("personality_query", "ok"),
        ("kexec_load", "EPERM"),
        ("open_by_handle_at", "EPERM"),
        ("userfaultfd", "EPERM"),
    ] {
        r.insert(k.into(), v.into());
    }
    r
}

/// A container running the probe, then sleeping; `profile` is its seccomp.
fn probe_container(name: &str, image: &str, profile: cri::SecurityProfile) -> cri::ContainerConfig {
    let mut c = crishim_tests::pods::container_config(
        name,
        image,
        &["/bin/sh", "-c", "/probe; exec sleep 1000"],
    );
    container_security(&mut c).seccomp = Some(profile);
    c
}

/// Run `c` in `pod`; the probe's results as its init (from the log) and as an exec'd process.
async fn run_probe(
    env: &PodEnv,
    pod: &str,
    pod_cfg: &cri::PodSandboxConfig,
    traces: &mut PodTraces,
    c: &cri::ContainerConfig,
) -> (String, Results, Results) {
    let id = env.d.run_container(pod, c, pod_cfg).await.unwrap();
    traces.add_container(&id);
    let log = Path::new(&pod_cfg.log_directory).join(&c.log_path);
    let records = wait_for_log_line(&log, "stdout", "probe-done", WAIT).await;
    let init: String = crishim_tests::pods::reassemble(&records, "stdout")
        .into_iter()
        .map(|l| String::from_utf8_lossy(&l).into_owned() + "\n")
        .collect();
    let execd = env.d.exec_ok(&id, &["/probe"]).await;
    (id, parse(&init), parse(&execd))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_default_and_an_oci_written_profile_hold_under_every_handler() {
    assert!(
        Path::new(RUNC).is_file(),
        "{RUNC} is missing: hack/install-deps.sh installs Debian's runc"
    );
    let env = PodEnv::start_with(
        DaemonOptions::new().extra_toml(&format!("[runtimes.runc]\nruntime = \"{RUNC}\"\n")),
    )
    .await;
    let layer = busybox_entries()
        .file("probe", build_probe(), 0o755)
        .build(Compression::Gzip);
    let image = env
        .push_and_pull("seccomp-probe", &Image::new(vec![layer]))
        .await
        .tag_ref();
    let runtime_default = cri::SecurityProfile {
        profile_type: ProfileType::RuntimeDefault as i32,
        ..Default::default()
    };

    let builtin_cfg = env.pod_config("seccomp-builtin");
    let builtin = env.d.run_pod(&builtin_cfg).await.unwrap();
    let mut builtin_traces = PodTraces::new(&builtin, &builtin_cfg);
    let runc_cfg = env.pod_config("seccomp-runc");
    let runc = env.d.run_pod_with_handler(&runc_cfg, "runc").await.unwrap();
    let mut runc_traces = PodTraces::new(&runc, &runc_cfg);

    // Unconfined, the calls reach the kernel: a new user namespace (with a network one) is
    // made, so the EPERMs below are the filter's.
    let unconfined = cri::SecurityProfile {
        profile_type: ProfileType::Unconfined as i32,
        ..Default::default()
    };
    let c = probe_container("unconfined", &image, unconfined);
    let (_, open, _) = run_probe(&env, &builtin, &builtin_cfg, &mut builtin_traces, &c).await;
    for (k, v) in [
        ("clone_newuser", "ok"),
        ("clone_newuser_newnet", "ok"),
        ("clone3", "ok"),
        ("unshare", "ok"),
        ("setns", "EBADF"),
        ("mount", "EFAULT"),
        ("keyctl", "EOPNOTSUPP"),
        ("personality_refused", "ok"),
    ] {
        assert_eq!(open.get(k).map(String::as_str), Some(v), "{k}: {open:#?}");
    }

    // RuntimeDefault: containerd's answers, under both runtimes, for the init and exec.
    let c = probe_container("default", &image, runtime_default.clone());
    let (builtin_id, ours, ours_exec) =
        run_probe(&env, &builtin, &builtin_cfg, &mut builtin_traces, &c).await;
    let (_, theirs, theirs_exec) = run_probe(&env, &runc, &runc_cfg, &mut runc_traces, &c).await;
    let expected = runtime_default_expected();
    assert_eq!(ours, expected, "RuntimeDefault under the built-in runtime");
    assert_eq!(theirs, expected, "RuntimeDefault under runc");
    assert_eq!(ours_exec, expected, "an exec'd process, built-in runtime");
    assert_eq!(theirs_exec, expected, "an exec'd process under runc");

    // A Localhost profile written the OCI way: RuntimeDefault's allow list with containerd's
    // clone rule as its JSON has it (value the mask, valueTwo 0), and keyctl and add_key
    // allowed (so the answers show which profile is loaded).
    let config: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            env.d
                .state_dir()
                .join("containers")
                .join(&builtin_id)
                .join("config.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut profile = config["linux"]["seccomp"].clone();
    let rules = profile["syscalls"].as_array_mut().unwrap();
    rules.retain(|r| r["names"] != serde_json::json!(["clone"]));
    rules.push(serde_json::json!({
        "names": ["clone"],
        "action": "SCMP_ACT_ALLOW",
        "args": [{"index": 0, "value": 2114060288u64, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]
    }));
    rules.push(serde_json::json!({"names": ["keyctl", "add_key"], "action": "SCMP_ACT_ALLOW"}));
    let path = env.d.dir().join("oci-written.json");
    std::fs::write(&path, profile.to_string()).unwrap();
    let local = cri::SecurityProfile {
        profile_type: ProfileType::Localhost as i32,
        localhost_ref: path.to_string_lossy().into_owned(),
    };
    let c = probe_container("local", &image, local);
    let (_, ours, ours_exec) =
        run_probe(&env, &builtin, &builtin_cfg, &mut builtin_traces, &c).await;
    let (_, theirs, theirs_exec) = run_probe(&env, &runc, &runc_cfg, &mut runc_traces, &c).await;
    let mut expected = runtime_default_expected();
    expected.insert("keyctl".into(), "EOPNOTSUPP".into());
    expected.insert("add_key".into(), "EFAULT".into());
    assert_eq!(ours, expected, "the Localhost profile, built-in runtime");
    assert_eq!(theirs, expected, "the Localhost profile under runc");
    assert_eq!(ours_exec, expected, "an exec'd process, built-in runtime");
    assert_eq!(theirs_exec, expected, "an exec'd process under runc");

    builtin_traces.capture(&env.d).await;
    env.d.stop_pod(&builtin).await.unwrap();
    env.d.remove_pod(&builtin).await.unwrap();
    assert_no_leaks(&env.d, &builtin_traces).await;
    env.finish_pod(&runc, runc_traces).await;
}
