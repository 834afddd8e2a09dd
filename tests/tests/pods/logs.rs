//! Container logs: the CRI log format, long lines and reopening.

use std::path::{Path, PathBuf};

use crishim_tests::pods::{
    assert_no_leaks, marker, parse_cri_log, reassemble, sh_container, wait_for_log_line, PodEnv,
    PodTraces, LOOP_UNTIL_TERM,
};

use super::WAIT;

#[tokio::test]
async fn container_logs_are_cri_lines_long_lines_split_at_16k_and_reopenable() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let cfg = env.pod_config("logs");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);

    // The kubelet's layout: <pod log dir>/<container name>/<attempt>.log, directory made by it.
    let log_dir = PathBuf::from(&cfg.log_directory);
    std::fs::create_dir_all(log_dir.join("logger")).unwrap();
    let script = format!(
        "echo out-marker; echo err-marker >&2; \
         head -c 40000 /dev/zero | tr '\\0' x; echo; echo after-long; \
         while ! test -e /tmp/go; do sleep 0.1; done; \
         echo second-file; echo second-err >&2; {LOOP_UNTIL_TERM}"
    );
    let mut c = sh_container(&env, "logger", &script, &marker("logger"));
    c.log_path = "logger/0.log".to_string();
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run the logging container");
    traces.add_container(&id);
    let path = log_dir.join("logger/0.log");
    let st = d.container_status(&id).await.unwrap();
    assert_eq!(Path::new(&st.log_path), path, "{st:#?}");

    wait_for_log_line(&path, "stdout", "after-long", WAIT).await;
    wait_for_log_line(&path, "stderr", "err-marker", WAIT).await;
    let bytes = std::fs::read(&path).unwrap();
    let records = parse_cri_log(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));

    let long = "x".repeat(40000);
    assert_eq!(
        reassemble(&records, "stdout"),
        vec![
            b"out-marker".to_vec(),
            long.as_bytes().to_vec(),
            b"after-long".to_vec()
        ],
        "stdout lines"
    );
    assert_eq!(
        reassemble(&records, "stderr"),
        vec![b"err-marker".to_vec()],
        "stderr lines"
    );
    let shape: Vec<(bool, usize)> = records
        .iter()
        .filter(|r| r.stream == "stdout")
        .map(|r| (r.partial, r.text.len()))
        .collect();
    assert_eq!(
        shape,
        vec![
            (false, 10),
            (true, 16384),
            (true, 16384),
            (false, 40000 - 2 * 16384),
            (false, 10)
        ],
        "stdout records as (partial, length)"
    );

    // Rotation: the kubelet renames the file, then asks for a new one at the same path.
    let rotated = PathBuf::from(format!("{}.1", path.display()));
    std::fs::rename(&path, &rotated).unwrap();
    d.reopen_container_log(&id)
        .await
        .expect("ReopenContainerLog");
    assert!(
        path.exists(),
        "ReopenContainerLog returned but {} does not exist (the kubelet would undo the rotation)",
        path.display()
    );
    d.exec_ok(&id, &["touch", "/tmp/go"]).await;
    let new = wait_for_log_line(&path, "stdout", "second-file", WAIT).await;
    wait_for_log_line(&path, "stderr", "second-err", WAIT).await;
    assert!(
        !reassemble(&new, "stdout").contains(&b"out-marker".to_vec()),
        "the new file holds old output"
    );
    let old = parse_cri_log(&std::fs::read(&rotated).unwrap()).unwrap();
    assert!(reassemble(&old, "stdout").contains(&b"after-long".to_vec()));
    for (stream, line) in [("stdout", "second-file"), ("stderr", "second-err")] {
        assert!(
            !reassemble(&old, stream).contains(&line.as_bytes().to_vec()),
            "{line} went to the rotated file"
        );
    }

    traces.capture(d).await;
    d.stop_container(&id, 10).await.expect("StopContainer");
    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}
