//! Errors: unknown ids and invalid configurations.

use std::path::PathBuf;

use crishim_proto::cri;
use crishim_tests::cri::spec;
use crishim_tests::pods::{
    assert_no_leaks, container_security, PodEnv, PodTraces, LOOP_UNTIL_TERM,
};
use crishim_tests::{busybox_image, random_hex};
use tonic::Code;

use super::{assert_code, Footprint};

#[tokio::test]
async fn unknown_ids_are_not_found_and_removals_of_unknown_ids_succeed() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let unknown = random_hex(32);
    assert_code(
        d.container_status(&unknown).await,
        Code::NotFound,
        "ContainerStatus",
    );
    assert_code(
        d.start_container(&unknown).await,
        Code::NotFound,
        "StartContainer",
    );
    assert_code(
        d.stop_container(&unknown, 1).await,
        Code::NotFound,
        "StopContainer",
    );
    assert_code(
        d.exec_sync(&unknown, &["true"], 5).await,
        Code::NotFound,
        "ExecSync",
    );
    assert_code(
        d.pod_status(&unknown).await,
        Code::NotFound,
        "PodSandboxStatus",
    );
    assert_code(d.stop_pod(&unknown).await, Code::NotFound, "StopPodSandbox");
    d.remove_container(&unknown)
        .await
        .expect("RemoveContainer of an unknown ID is OK");
    d.remove_pod(&unknown)
        .await
        .expect("RemovePodSandbox of an unknown ID is OK");

    let cfg = env.pod_config("unknown");
    let c = env.container_config("c", &["/bin/sh", "-c", LOOP_UNTIL_TERM]);
    assert_code(
        d.create_container(&unknown, &c, &cfg).await,
        Code::NotFound,
        "CreateContainer in an unknown pod",
    );

    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    traces.capture(d).await;
    let mut never = c.clone();
    never.image = Some(spec(&format!("{}/never-pulled:latest", env.reg.host())));
    assert_code(
        d.create_container(&pod, &never, &cfg).await,
        Code::NotFound,
        "CreateContainer from an image that was never pulled",
    );
    assert!(d.list_container_ids(None).await.unwrap().is_empty());

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}

#[tokio::test]
async fn garbage_container_configs_are_invalid_argument_and_leave_nothing() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut no_cmd = busybox_image();
    no_cmd.config.cmd = None;
    no_cmd.config.entrypoint = None;
    let no_cmd = env.push_and_pull("nocmd", &no_cmd).await;

    let cfg = env.pod_config("garbage");
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    traces.capture(d).await;
    let before = Footprint::of(d);

    let good = env.container_config("g", &["/bin/sh", "-c", LOOP_UNTIL_TERM]);
    let token = random_hex(6);
    let log_dir = PathBuf::from(&cfg.log_directory);
    let escapes = [
        PathBuf::from(format!("/tmp/crishim-escape-{token}.log")),
        log_dir
            .parent()
            .unwrap()
            .join(format!("escape-{token}.log")),
    ];
    let mut cases: Vec<(&str, cri::ContainerConfig)> = Vec::new();
    let mut c = good.clone();
    c.image = Some(spec(""));
    cases.push(("empty image", c));
    let mut c = good.clone();
    c.log_path = escapes[0].to_string_lossy().into_owned();
    cases.push(("absolute log path", c));
    let mut c = good.clone();
    c.log_path = format!("../escape-{token}.log");
    cases.push(("../ log path", c));
    let mut c = good.clone();
    c.log_path = format!("sub/../../escape-{token}.log");
    cases.push(("sub/../../ log path", c));
    let mut c = good.clone();
    container_security(&mut c).run_as_username = format!("no-such-user-{token}");
    cases.push(("unknown run_as_username", c));
    let mut c = good.clone();
    c.image = Some(spec(&no_cmd.tag_ref()));
    c.command.clear();
    c.args.clear();
    cases.push(("no command (none in the image either)", c));

    for (what, c) in &cases {
        let r = d.create_container(&pod, c, &cfg).await;
        assert_code(
            r,
            Code::InvalidArgument,
            &format!("CreateContainer with {what}"),
        );
    }
    assert!(
        d.list_container_ids(None).await.unwrap().is_empty(),
        "refused containers are listed"
    );
    for e in &escapes {
        assert!(!e.exists(), "a refused log path created {}", e.display());
    }
    before.assert_nothing_new(d, "refused containers");

    // The pod is unharmed: a good container still runs.
    let id = d
        .run_container(&pod, &good, &cfg)
        .await
        .expect("run a good container");
    traces.add_container(&id);
    assert_eq!(d.exec_ok(&id, &["echo", "ok"]).await, "ok\n");

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}
