//! The process: args, env, working dir, tty and rlimits.

use super::*;

#[test]
fn args_default_to_image_entrypoint_then_cmd() {
    let mut f = Fixture::new();
    f.image.set_entrypoint(Some(strings(&["/entry.sh"])));
    f.image.set_cmd(Some(strings(&["serve", "--port=80"])));
    assert_eq!(
        args(&f.spec()),
        strings(&["/entry.sh", "serve", "--port=80"])
    );
}

#[test]
fn command_replaces_image_entrypoint_and_drops_image_cmd() {
    let mut f = Fixture::new();
    f.image.set_entrypoint(Some(strings(&["/entry.sh"])));
    f.image.set_cmd(Some(strings(&["serve"])));
    f.config.command = strings(&["/bin/echo"]);
    assert_eq!(args(&f.spec()), strings(&["/bin/echo"]));
}

#[test]
fn args_replace_image_cmd_and_keep_image_entrypoint() {
    let mut f = Fixture::new();
    f.image.set_entrypoint(Some(strings(&["/entry.sh"])));
    f.image.set_cmd(Some(strings(&["serve"])));
    f.config.args = strings(&["migrate", "--dry-run"]);
    assert_eq!(
        args(&f.spec()),
        strings(&["/entry.sh", "migrate", "--dry-run"])
    );
}

#[test]
fn command_and_args_are_joined() {
    let mut f = Fixture::new();
    f.image.set_entrypoint(Some(strings(&["/entry.sh"])));
    f.config.command = strings(&["/bin/sh", "-c"]);
    f.config.args = strings(&["echo hi"]);
    assert_eq!(args(&f.spec()), strings(&["/bin/sh", "-c", "echo hi"]));
}

#[test]
fn empty_string_image_entrypoint_is_no_entrypoint() {
    let mut f = Fixture::new();
    f.image.set_entrypoint(Some(strings(&[""])));
    f.image.set_cmd(Some(strings(&["/bin/app"])));
    assert_eq!(args(&f.spec()), strings(&["/bin/app"]));
}

#[test]
fn no_command_anywhere_is_invalid() {
    let mut f = Fixture::new();
    f.image.set_cmd(None);
    let msg = f.invalid();
    assert!(msg.starts_with("no command specified"), "{msg}");
}

/// The CRI carries env values as bytes; one that is not UTF-8 reaches the process exactly
/// through crishim-init (the spec carries it hex-encoded in one entry), and is never mangled.
#[test]
fn an_env_value_that_is_not_utf8_goes_exactly_through_init() {
    let mut f = Fixture::new();
    f.image
        .set_env(Some(vec!["BLOB=from-image".into(), "KEEP=1".into()]));
    f.config.envs = vec![
        cri::KeyValue {
            key: "BLOB".to_string(),
            value: vec![b'a', 0xff, 0xfe],
        },
        cri::KeyValue {
            key: "PLAIN".to_string(),
            value: b"yes".to_vec(),
        },
    ];
    // Without crishim-init it cannot be done: refused, saying why.
    let msg = f.invalid();
    assert!(
        msg.contains("UTF-8") && msg.contains("crishim-init"),
        "{msg}"
    );

    f.init_binary = Some("/usr/libexec/crishim/init".into());
    let spec = f.build().unwrap();
    let process = spec.process().as_ref().unwrap();
    let env = process.env().as_ref().unwrap();
    assert!(env.contains(&"PLAIN=yes".to_string()) && env.contains(&"KEEP=1".to_string()));
    assert!(
        !env.iter().any(|e| e.starts_with("BLOB=")),
        "the image's value is replaced: {env:?}"
    );
    assert!(env.contains(&format!(
        "{}={}",
        crishim_proto::init::RAW_ENV,
        crishim_proto::init::encode_raw_env(&[b"BLOB=a\xff\xfe".to_vec()])
    )));
    let args = process.args().as_ref().unwrap();
    assert_eq!(args[..3], [INIT_PATH, "--exec", "--"], "{args:?}");

    // A NUL no process can be given, and the carrier's name is reserved.
    f.config.envs[0].value = vec![0xff, 0];
    assert!(f.invalid().contains("NUL"));
    f.config.envs = vec![cri::KeyValue {
        key: crishim_proto::init::RAW_ENV.to_string(),
        value: b"41".to_vec(),
    }];
    assert!(f.invalid().contains("reserved"));
}

/// An env entry with an empty name or a NUL byte made the runtime's init abort the create with a
/// panic whose message (the whole value) could fill its stderr pipe before the shim read it: the
/// create never returned. Such entries are refused, from the request and from the image alike.
#[test]
fn env_entries_no_process_can_get_are_refused() {
    for (key, value) in [
        ("", "x".repeat(100_000)),
        ("K\0", "v".into()),
        ("K", "v\0".into()),
    ] {
        let mut f = Fixture::new();
        f.config.envs = vec![cri::KeyValue {
            key: key.to_string(),
            value: value.into_bytes(),
        }];
        let msg = f.invalid();
        assert!(
            msg.contains("empty name or a NUL") && msg.len() < 1024,
            "{key:?}: {msg}"
        );
    }
    let mut f = Fixture::new();
    f.image.set_env(Some(strings(&["=from-the-image"])));
    assert!(f.invalid().contains("empty name or a NUL"));
}

#[test]
fn env_is_image_env_then_config_env_later_value_wins_in_place() {
    let mut f = Fixture::new();
    f.image.set_env(Some(strings(&[
        "PATH=/opt/bin:/bin",
        "LANG=C",
        "MODE=image",
    ])));
    f.config.envs = vec![
        cri::KeyValue {
            key: "MODE".to_string(),
            value: "pod".to_string().into(),
        },
        cri::KeyValue {
            key: "EXTRA".to_string(),
            value: "a=b".to_string().into(),
        },
    ];
    assert_eq!(
        env(&f.spec()),
        strings(&[
            "PATH=/opt/bin:/bin",
            "HOSTNAME=web-0",
            "LANG=C",
            "MODE=pod",
            "EXTRA=a=b"
        ])
    );
}

#[test]
fn image_env_entry_without_a_value_unsets_the_key() {
    let mut f = Fixture::new();
    f.image
        .set_env(Some(strings(&["LANG=C", "TZ=UTC", "LANG"])));
    let env = env(&f.spec());
    assert!(env.contains(&"TZ=UTC".to_string()));
    assert!(!env.iter().any(|e| e.starts_with("LANG")));
}

#[test]
fn env_has_the_default_path_when_the_image_sets_none() {
    let f = Fixture::new();
    let env = env(&f.spec());
    assert_eq!(
        env[0],
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    );
    assert_eq!(env.iter().filter(|e| e.starts_with("PATH=")).count(), 1);
}

#[test]
fn hostname_env_is_the_pod_hostname_and_a_config_env_can_override_it() {
    let mut f = Fixture::new();
    assert!(env(&f.spec()).contains(&"HOSTNAME=web-0".to_string()));
    f.config.envs = vec![cri::KeyValue {
        key: "HOSTNAME".to_string(),
        value: "custom".to_string().into(),
    }];
    let env = env(&f.spec());
    assert!(env.contains(&"HOSTNAME=custom".to_string()));
    assert!(!env.contains(&"HOSTNAME=web-0".to_string()));
}

#[test]
fn hostname_env_falls_back_to_the_node_name_when_the_pod_has_none() {
    let mut f = Fixture::new();
    f.sandbox.hostname.clear();
    assert!(env(&f.spec()).contains(&"HOSTNAME=node-1".to_string()));
}

#[test]
fn working_dir_is_config_then_image_then_root() {
    let mut f = Fixture::new();
    assert_eq!(process(&f.spec()).cwd(), Path::new("/"));
    f.image.set_working_dir(Some("/srv".to_string()));
    assert_eq!(process(&f.spec()).cwd(), Path::new("/srv"));
    f.config.working_dir = "/work".to_string();
    assert_eq!(process(&f.spec()).cwd(), Path::new("/work"));
}

#[test]
fn tty_sets_terminal_and_term() {
    let mut f = Fixture::new();
    assert_eq!(process(&f.spec()).terminal(), Some(false));
    f.config.tty = true;
    let spec = f.spec();
    assert_eq!(process(&spec).terminal(), Some(true));
    assert!(env(&spec).contains(&"TERM=xterm".to_string()));
}

#[test]
fn nofile_rlimit_is_raised() {
    let spec = Fixture::new().spec();
    let rlimits = process(&spec).rlimits().clone().unwrap();
    assert_eq!(rlimits.len(), 1);
    assert_eq!(
        rlimits[0].typ(),
        oci_spec::runtime::PosixRlimitType::RlimitNofile
    );
    assert_eq!(
        (rlimits[0].soft(), rlimits[0].hard()),
        (1_048_576, 1_048_576)
    );
}

#[test]
fn nofile_rlimit_stays_within_what_the_daemon_may_grant() {
    let mut f = Fixture::new();
    f.host.nofile_hard = Some(20_000);
    let spec = f.spec();
    let rlimits = process(&spec).rlimits().clone().unwrap();
    assert_eq!((rlimits[0].soft(), rlimits[0].hard()), (20_000, 20_000));
}
