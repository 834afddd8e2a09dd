//! ExecSync: exit codes, output and timeouts.

use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_tests::pods::{
    assert_no_leaks, marker, processes_with_command, sh_container, wait_no_process_with_command,
    PodEnv, PodTraces, LOOP_UNTIL_TERM,
};
use crishim_tests::random_hex;
use tonic::Code;

use cri::ContainerState::ContainerRunning;

use super::{assert_code, text};

#[tokio::test]
async fn exec_sync_reports_exit_codes_and_output_and_kills_on_timeout() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("exec");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let c = sh_container(&env, "exec", LOOP_UNTIL_TERM, &marker("exec"));
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run container");
    traces.add_container(&id);
    traces.capture(d).await;

    let r = d
        .exec_sync(
            &id,
            &["sh", "-c", "echo to-out; echo to-err >&2; exit 7"],
            10,
        )
        .await
        .expect("ExecSync exit 7");
    assert_eq!(r.exit_code, 7, "{r:?}");
    assert_eq!(text(&r.stdout), "to-out\n");
    assert_eq!(text(&r.stderr), "to-err\n");

    // 20 MB on each stream: the reply is truncated to fit one 16 MiB gRPC message (it used to
    // exceed it), each stream keeping half.
    // A client with the kubelet's 16 MiB message limit.
    let r = d
        .runtime_client()
        .max_decoding_message_size(16 << 20)
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.clone(),
            cmd: [
                "sh",
                "-c",
                "head -c 20000000 /dev/zero; head -c 20000000 /dev/zero >&2",
            ]
            .map(String::from)
            .to_vec(),
            timeout: 60,
        })
        .await
        .expect("ExecSync of 40 MB of output")
        .into_inner();
    let max = crishim_proto::shim::MAX_EXEC_OUTPUT;
    assert_eq!(
        (r.stdout.len(), r.stderr.len()),
        (max - max / 2, max / 2),
        "exit {}",
        r.exit_code
    );
    assert_eq!(r.exit_code, 0);
    for (cmd, code) in [
        (vec!["true"], 0),
        (vec!["false"], 1),
        (vec!["sh", "-c", "kill -9 $$"], 137),
    ] {
        let r = d.exec_sync(&id, &cmd, 10).await.expect("ExecSync");
        assert_eq!(r.exit_code, code, "{cmd:?}: {r:?}");
    }

    // Timeout: DeadlineExceeded soon after, and the process (and its children) killed. The
    // second case also looks for the process on the host while it runs (a positive control for
    // the "gone" check).
    let n1 = 30000 + u32::from_str_radix(&random_hex(2), 16).unwrap();
    let n2 = 40000 + u32::from_str_radix(&random_hex(2), 16).unwrap();
    let cases = [
        (
            vec!["sleep".to_string(), n1.to_string()],
            format!("sleep {n1}"),
            1,
        ),
        (
            vec![
                "sh".to_string(),
                "-c".to_string(),
                format!("sleep {n2}; echo never"),
            ],
            format!("sleep {n2}"),
            3,
        ),
    ];
    for (cmd, needle, timeout) in cases {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let t0 = Instant::now();
        let probe = async {
            if timeout < 2 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Some(processes_with_command(&needle))
        };
        let (r, seen) = tokio::join!(d.exec_sync(&id, &args, timeout), probe);
        let took = t0.elapsed();
        assert_code(
            r,
            Code::DeadlineExceeded,
            &format!("ExecSync {cmd:?} timeout {timeout}"),
        );
        let limit = Duration::from_secs(timeout as u64);
        assert!(
            took >= limit - Duration::from_millis(100) && took < limit + Duration::from_secs(8),
            "ExecSync {cmd:?} with timeout {timeout} s returned after {took:?}"
        );
        if let Some(seen) = seen {
            assert!(
                seen.len() >= 2,
                "while the exec ran, the host did not show both `sh -c` and `sleep` of {needle:?}: {seen:#?}"
            );
        }
        let left = wait_no_process_with_command(&needle, Duration::from_secs(3)).await;
        assert!(
            left.is_empty(),
            "the timed-out exec {cmd:?} still runs: {left:#?}"
        );
    }

    // The container is unharmed.
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(st.state, ContainerRunning as i32, "{st:#?}");
    assert_eq!(
        d.exec_ok(&id, &["echo", "still-here"]).await,
        "still-here\n"
    );

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}
