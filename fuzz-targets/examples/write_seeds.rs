//! Writes the seed corpora, `fuzz/corpus/<target>/seed-*`: small valid inputs built with the
//! crates' own encoders, so the fuzzers start from what real peers send.
//! `cargo run -p crishim-fuzz --example write_seeds` (overwrites the seeds, nothing else).

use std::path::{Path, PathBuf};

use crishim_streaming::spdy::frame::{self, control, data};
use crishim_streaming::spdy::headers::{Encoder, Headers};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
}

fn seed(target: &str, name: &str, bytes: &[u8]) {
    let dir = root().join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
}

/// Inputs that crashed or hung a target, kept as `fuzz/regressions/<target>/<name>`.
fn regression(target: &str, name: &str, bytes: &[u8]) {
    let dir = root().join("../regressions").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn h(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A client's SYN_STREAM for stream `id`.
fn syn(enc: &mut Encoder, id: u32, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut p = id.to_be_bytes().to_vec();
    p.extend_from_slice(&[0; 6]);
    p.extend(enc.encode(&h(headers)));
    control(frame::SYN_STREAM, 0, &p)
}

/// A masked (client-to-server) WebSocket frame.
fn ws(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    let key = [0x12, 0x34, 0x56, 0x78];
    f.extend_from_slice(&key);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    f
}

fn spdy() {
    let mut enc = Encoder::new();
    let mut wire = syn(&mut enc, 1, &[("streamType", "stdin")]);
    wire.extend(data(1, false, b"hello\n"));
    wire.extend(data(1, true, b""));
    wire.extend(control(frame::PING, 0, &1u32.to_be_bytes()));
    wire.extend(control(frame::SETTINGS, 0, &[0, 0, 0, 0]));
    wire.extend(control(frame::WINDOW_UPDATE, 0, &[0, 0, 0, 1, 0, 1, 0, 0]));
    let mut rst = 3u32.to_be_bytes().to_vec();
    rst.extend_from_slice(&frame::RST_CANCEL.to_be_bytes());
    wire.extend(syn(&mut enc, 3, &[("streamType", "stdout")]));
    wire.extend(control(frame::RST_STREAM, 0, &rst));
    wire.extend(control(frame::GOAWAY, 0, &[0; 8]));
    seed("spdy_frames", "streams", &wire);

    let mut enc = Encoder::new();
    let mut blocks = Vec::new();
    for i in 0..3 {
        let b = enc.encode(&h(&[("streamType", "data"), ("port", &format!("808{i}"))]));
        blocks.extend_from_slice(&(b.len() as u16).to_be_bytes());
        blocks.extend(b);
    }
    seed("spdy_headers", "three-blocks", &blocks);

    // Issue 14: a header block that is a whole zlib stream (with the SPDY dictionary) and one
    // byte more made the decoder loop for ever.
    let mut z = flate2::Compress::new(flate2::Compression::default(), true);
    z.set_dictionary(&crishim_streaming::spdy::headers::dictionary())
        .unwrap();
    let mut block = Vec::with_capacity(256);
    z.compress_vec(&[0, 0, 0, 0], &mut block, flate2::FlushCompress::Finish)
        .unwrap();
    block.push(0);
    let mut framed = (block.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&block);
    regression("spdy_headers", "issue-14-stream-end-then-a-byte", &framed);
    let mut p = 1u32.to_be_bytes().to_vec();
    p.extend_from_slice(&[0; 6]);
    p.extend_from_slice(&block);
    regression(
        "spdy_frames",
        "issue-14-stream-end-then-a-byte",
        &control(frame::SYN_STREAM, 0, &p),
    );

    // Exec: v4 (protocol 0), stdin + stdout + stderr + tty: error, stdin, stdout and resize.
    let mut enc = Encoder::new();
    let mut wire = vec![0x0f];
    for (id, kind) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "resize")] {
        wire.extend(syn(&mut enc, id, &[("streamType", kind)]));
    }
    wire.extend(data(7, false, br#"{"Width":80,"Height":24}"#));
    wire.extend(data(3, false, b"echo hi\n"));
    wire.extend(data(3, true, b""));
    seed("remotecommand_spdy", "exec-tty-v4", &wire);

    // PortForward of port 80 (allowed: 80): a data and an error stream, then data.
    let mut enc = Encoder::new();
    let mut wire = vec![0x01];
    for (id, kind) in [(1, "error"), (3, "data")] {
        wire.extend(syn(
            &mut enc,
            id,
            &[("streamType", kind), ("port", "80"), ("requestID", "0")],
        ));
    }
    wire.extend(data(3, false, b"GET / HTTP/1.0\r\n\r\n"));
    wire.extend(data(3, true, b""));
    seed("portforward_spdy", "port-80", &wire);
}

fn websocket() {
    let mut wire = ws(0x2, b"\x00hello\n");
    wire.extend(ws(0x1, b"0aGVsbG8K"));
    wire.extend(ws(0x9, b"ping"));
    wire.extend(ws(0x8, &1000u16.to_be_bytes()));
    seed("websocket_frames", "messages", &wire);

    // Exec: v5 (protocol 0), stdin + stdout + stderr; stdin data, then v5's close of stdin.
    let mut wire = vec![0x07];
    wire.extend(ws(0x2, b"\x00echo hi\n"));
    wire.extend(ws(0x2, b"\x04{\"Width\":80,\"Height\":24}"));
    wire.extend(ws(0x2, b"\xff\x00"));
    wire.extend(ws(0x8, &1000u16.to_be_bytes()));
    seed("remotecommand_ws", "exec-v5", &wire);

    // PortForward: v4 (protocol 0), ports 80 and 443; data on the first port's channel.
    let mut wire = vec![0x02];
    wire.extend(ws(0x2, b"\x00GET / HTTP/1.0\r\n\r\n"));
    wire.extend(ws(0x8, &1000u16.to_be_bytes()));
    seed("portforward_ws", "two-ports", &wire);
}

fn tar_layer() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |path: &str, kind: tar::EntryType, link: Option<&str>, body: &[u8]| {
        let mut hd = tar::Header::new_gnu();
        hd.set_entry_type(kind);
        hd.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        hd.set_size(body.len() as u64);
        if let Some(l) = link {
            hd.set_link_name(l).unwrap();
        }
        b.append_data(&mut hd, path, body).unwrap();
    };
    add("etc/", tar::EntryType::Directory, None, b"");
    add("etc/hostname", tar::EntryType::Regular, None, b"layer\n");
    add("etc/link", tar::EntryType::Symlink, Some("hostname"), b"");
    add("etc/hard", tar::EntryType::Link, Some("etc/hostname"), b"");
    add("etc/.wh.gone", tar::EntryType::Regular, None, b"");
    add("var/.wh..wh..opq", tar::EntryType::Regular, None, b"");
    add("run/fifo", tar::EntryType::Fifo, None, b"");
    b.into_inner().unwrap()
}

fn images() {
    use std::io::Write as _;
    let layer = tar_layer();
    seed("tar_unpack", "plain.tar", &layer);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&layer).unwrap();
    seed("tar_unpack", "layer.tar.gz", &gz.finish().unwrap());
    seed(
        "tar_unpack",
        "layer.tar.zst",
        &zstd::encode_all(&layer[..], 3).unwrap(),
    );

    for (name, r) in [
        ("short", "busybox"),
        ("tagged", "registry.k8s.io/pause:3.9"),
        ("port", "127.0.0.1:5000/library/busybox:1.36"),
        (
            "digest",
            "docker.io/library/busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000",
        ),
        ("id", "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
    ] {
        seed("image_reference", name, r.as_bytes());
    }

    let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    let manifest = format!(
        r#"application/vnd.oci.image.manifest.v1+json
{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":2}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{}","size":3}}]}}"#,
        d('a'),
        d('b')
    );
    seed("registry_reply", "manifest", manifest.as_bytes());
    let index = format!(
        r#"application/vnd.oci.image.index.v1+json
{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{}","size":7,"platform":{{"architecture":"amd64","os":"linux"}}}},{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{}","size":7,"platform":{{"architecture":"arm64","os":"linux","variant":"v8"}}}}]}}"#,
        d('c'),
        d('d')
    );
    seed("registry_reply", "index", index.as_bytes());
    let config = format!(
        r#"application/octet-stream
{{"architecture":"amd64","os":"linux","config":{{"Env":["PATH=/bin"],"Cmd":["sh"],"User":"1000:1000"}},"rootfs":{{"type":"layers","diff_ids":["{}","{}"]}}}}"#,
        d('e'),
        d('f')
    );
    seed("registry_reply", "config", config.as_bytes());

    seed(
        "www_authenticate",
        "bearer",
        br#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull"
{"token":"abc","access_token":"def","expires_in":300}"#,
    );
    seed("www_authenticate", "basic", b"Basic realm=\"registry\"\n{}");

    seed(
        "hosts_toml",
        "mirror",
        br#"server = "https://registry-1.docker.io"
[host."https://mirror.example.com:5000/prefix"]
  capabilities = ["pull", "resolve"]
  skip_verify = false
  override_path = true
  ca = ["ca.pem", "/etc/ssl/certs/ca.pem"]
  client = [["client.cert", "client.key"], "combined.pem"]
  [host."https://mirror.example.com:5000/prefix".header]
    x-one = "1"
    x-many = ["a", "b"]
"#,
    );
    seed(
        "hosts_toml",
        "default",
        b"skip_verify = true\n[header]\nx = \"y\"\n",
    );
}

fn shim() {
    use crishim_proto::shim::{frames, Request, Response};
    let req = Request::ExecStream {
        id: "c1".into(),
        args: vec!["sh".into(), "-c".into(), "echo hi".into()],
        tty: true,
        stdin: true,
    };
    let mut wire = serde_json::to_vec(&req).unwrap();
    wire.push(b'\n');
    wire.extend(frames::encode(frames::STDIN, b"echo hi\n"));
    wire.extend(frames::encode(frames::RESIZE, &[0, 80, 0, 24]));
    wire.extend(frames::encode(frames::STDIN_EOF, b""));
    seed("shim_protocol", "exec-stream", &wire);
    let resp = Response::Exec {
        exit_code: 1,
        stdout: b"out".to_vec(),
        stderr: b"err".to_vec(),
        timed_out: false,
    };
    seed(
        "shim_protocol",
        "exec-answer",
        &serde_json::to_vec(&resp).unwrap(),
    );
    let update = r#"{"op":"update","id":"c1","resources":{"memory":{"limit":1048576},"cpu":{"shares":512,"quota":50000,"period":100000},"pids":{"limit":64},"unified":{"memory.high":"1000000"}}}"#;
    seed("shim_protocol", "update", update.as_bytes());
}

fn runtime() {
    let state = r#"{"id":"c1","status":"exited","pid":42,"created_at":1,"started_at":2,"finished_at":3,"exit_code":137,"oom_killed":true,"message":""}"#;
    seed("records", "exit-record", state.as_bytes());
    let pod = r#"{"id":"p1","config":"CgYKAXASAXU=","runtime_handler":"","state":"Ready","created_at":1,"infra_pid":42,"host_network":false,"host_pid":false,"host_ipc":false,"shared_pid":false,"shm":"/run/crishim/pods/p1/shm","cgroup_parent":"/crishim/p1","cgroup_driver":"cgroupfs","owned_cgroups":["/crishim/p1"],"ips":["10.88.0.2"]}"#;
    seed("records", "pod", pod.as_bytes());
    let ctr = r#"{"id":"c1","pod_id":"p1","config":"CgMKAWM=","image":"busybox","image_id":"sha256:00","image_ref":"busybox","created_at":1,"log_path":"/var/log/c1.log","bundle":"/run/crishim/c1","stop_signal":15,"last":null}"#;
    seed("records", "container", ctr.as_bytes());
    let cache = r#"{"kind":"crishim-cni-cache/v1","containerId":"p1","ifName":"eth0","netns":"/run/netns/p1","cniArgs":"K8S_POD_NAME=p","config":{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]},"result":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/p1"}],"ips":[{"address":"10.88.0.2/16","interface":0}]}}"#;
    seed("records", "cni-cache", cache.as_bytes());
    // A journal after a pod's life: put, update, a second key, a removal (its bytes after the
    // magic, as the target takes them).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let j = crishim_state::journal::Journal::open(&path, 1 << 16, dir.path()).unwrap();
    j.put("p1", pod.as_bytes()).unwrap();
    j.put("c1", ctr.as_bytes()).unwrap();
    j.put("p1", pod.replace("Ready", "NotReady").as_bytes())
        .unwrap();
    j.remove("c1").unwrap();
    drop(j);
    seed("journal", "pod-life", &std::fs::read(&path).unwrap()[8..]);
    let mounts = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                  32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                  49 22 0:49 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/a\\040b rw master:3 - tmpfs tmpfs rw\n\
                  50 22 0:50 / /run/crishim/pods/p1/shm rw,nosuid shared:7 master:1 - tmpfs shm rw,size=65536k\n\
                  51 22 0:4 net:[4026532] /run/crishim/netns/p1 rw shared:8 - nsfs nsfs rw\n";
    seed("mountinfo", "node", mounts.as_bytes());
    // A `struct statmount`: 512 bytes of fields (size, mask, the type's and the mount point's
    // offsets, the propagation), then the strings.
    let mut sm = vec![0u8; 512];
    let strings = b"/run/crishim/pods/p1/shm\0tmpfs\0";
    sm[0..4].copy_from_slice(&(512 + strings.len() as u32).to_ne_bytes());
    sm[8..16].copy_from_slice(&0x32u64.to_ne_bytes());
    sm[36..40].copy_from_slice(&25u32.to_ne_bytes());
    sm[72..80].copy_from_slice(&0x100000u64.to_ne_bytes());
    sm.extend_from_slice(strings);
    assert!(crishim_sys::mountinfo::parse_statmount(&sm).is_some());
    seed("mountinfo", "statmount", &sm);

    let v1 = r#"eth0
{"cniVersion":"1.0.0","interfaces":[{"name":"cni0","mac":"aa:bb:cc:dd:ee:ff"},{"name":"eth0","sandbox":"/run/netns/x"}],"ips":[{"address":"10.88.0.5/16","gateway":"10.88.0.1","interface":1},{"address":"fd00::5/64","interface":1}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{"nameservers":["10.88.0.1"]}}"#;
    seed("cni_result", "v1", v1.as_bytes());
    let v020 = r#"eth0
{"cniVersion":"0.2.0","ip4":{"ip":"10.1.0.5/24","gateway":"10.1.0.1"},"ip6":{"ip":"fd00::5/64"}}"#;
    seed("cni_result", "v020", v020.as_bytes());
    let list = r#"eth0
{"cniVersion":"0.4.0","name":"crishim","plugins":[{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.88.0.0/16"}},{"type":"portmap","capabilities":{"portMappings":true}}]}"#;
    seed("cni_result", "conflist", list.as_bytes());

    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/workflow");
    for name in [
        "workflow.yaml",
        "native-sidecar.yaml",
        "retry.yaml",
        "unsupported.yaml",
    ] {
        seed("pod_manifest", name, &std::fs::read(ws.join(name)).unwrap());
    }
    let hack = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/config.toml");
    seed("config_toml", "hack", &std::fs::read(hack).unwrap());
    let full = r#"socket = "/run/crishim/crishim.sock"
root_dir = "/var/lib/crishim"
state_dir = "/run/crishim"
pinned_images = ["registry.k8s.io/pause:3.9"]
init = false
cgroup_driver = "systemd"

[cni]
conf_dir = "/etc/cni/net.d"
bin_dirs = ["/opt/cni/bin", "/usr/lib/cni"]

[streaming]
address = "127.0.0.1:0"
token_ttl_seconds = 60

[registry.mirrors."registry.k8s.io"]
endpoint = ["http://127.0.0.1:5000"]

[registry.configs."registry.example.com".auth]
username = "u"
password = "p"

[registry.configs."127.0.0.1:5000".tls]
insecure_skip_verify = true

[gpu]
device_root = "/dev"
inject = "preload"
cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
"#;
    seed("config_toml", "full", full.as_bytes());

    seed("vgpu_ledger", "three-records", &crishim_fuzz::ledger_seed());
}

/// A plugin's socket: the stream cut every 7 bytes, a ttrpc request on the plugin's
/// connection and a response on the runtime's.
fn nri() {
    use crishim_nri::{mux, ttrpc};
    use prost::Message as _;
    let request = ttrpc::Request {
        service: "nri.pkg.api.v1alpha1.Plugin".into(),
        method: "Configure".into(),
        payload: b"\x0a\x00".to_vec().into(),
        timeout_nano: 2_000_000_000,
        metadata: vec![],
    };
    let response = ttrpc::Response {
        status: Some(ttrpc::Status {
            code: 0,
            message: String::new(),
            details: vec![],
        }),
        payload: Default::default(),
    };
    let mut out = bytes::BytesMut::from(&[7u8][..]);
    for (conn, stream, kind, body) in [
        (
            mux::PLUGIN_SERVICE_CONN,
            1,
            ttrpc::Kind::Request,
            request.encode_to_vec(),
        ),
        (
            mux::RUNTIME_SERVICE_CONN,
            1,
            ttrpc::Kind::Response,
            response.encode_to_vec(),
        ),
    ] {
        let mut m = bytes::BytesMut::new();
        let msg = ttrpc::Message {
            stream_id: stream,
            kind,
            flags: 0,
            payload: body.into(),
        };
        ttrpc::encode(&msg, &mut m).unwrap();
        mux::encode(conn, &m, &mut out);
    }
    seed("nri_wire", "configure", &out);
    nri_reply();
}

/// A plugin's reply to CreateContainer that adjusts a bit of everything.
fn nri_reply() {
    use crishim_nri::api;
    use prost::Message as _;
    let adjust = api::ContainerAdjustment {
        annotations: [("a".to_string(), "b".to_string())].into(),
        mounts: vec![api::Mount {
            destination: "/data".into(),
            r#type: "bind".into(),
            source: "/srv".into(),
            options: vec!["rbind".into(), "ro".into()],
        }],
        env: vec![api::KeyValue {
            key: "K".into(),
            value: "V".into(),
        }],
        rlimits: vec![api::PosixRlimit {
            r#type: "RLIMIT_NOFILE".into(),
            hard: 1024,
            soft: 1024,
        }],
        linux: Some(api::LinuxContainerAdjustment {
            devices: vec![api::LinuxDevice {
                path: "/dev/null2".into(),
                r#type: "c".into(),
                major: 1,
                minor: 3,
                ..Default::default()
            }],
            resources: Some(api::LinuxResources {
                memory: Some(api::LinuxMemory {
                    limit: Some(api::OptionalInt64 { value: 1 << 26 }),
                    ..Default::default()
                }),
                cpu: Some(api::LinuxCpu {
                    cpus: "0".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            oom_score_adj: Some(api::OptionalInt { value: 100 }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let reply = api::CreateContainerResponse {
        adjust: Some(adjust),
        ..Default::default()
    };
    let mut out = vec![255u8];
    out.extend(reply.encode_to_vec());
    seed("nri_reply", "adjust-everything", &out);
}

fn main() {
    nri();
    spdy();
    websocket();
    images();
    shim();
    runtime();
    println!("seeds written under {}", root().display());
}
