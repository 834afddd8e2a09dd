//! Pod networking through the CRI with the real CNI plugins (bridge + host-local + portmap from
//! /usr/lib/cni), configured by each test in its daemon's private CNI config directory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use crishim_proto::cri;
use crishim_tests::pods::{
    assert_no_leaks, namespaces, set_pod_namespaces, PodEnv, PodTraces, NS_NODE, NS_POD,
};
use crishim_tests::random_hex;
use serde_json::json;

/// One test's network: its own bridge, /24 and IPAM directory.
struct Net {
    bridge: String,
    third: u8,
    ipam: PathBuf,
}

impl Net {
    fn subnet(&self) -> String {
        format!("10.98.{}.0/24", self.third)
    }

    /// Write the conflist where the test daemon reads it.
    fn install(env: &PodEnv, third: u8) -> Net {
        let net = Net {
            bridge: format!("crs{}", random_hex(3)),
            third,
            ipam: env.d.dir().join("ipam"),
        };
        let list = json!({
            "cniVersion": "1.0.0",
            "name": "crishim-test",
            "plugins": [
                {
                    "type": "bridge", "bridge": net.bridge, "isGateway": true, "ipMasq": false,
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": net.subnet()}]],
                             "routes": [{"dst": "0.0.0.0/0"}], "dataDir": net.ipam}
                },
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        let dir = env.d.dir().join("cni");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("10-test.conflist"),
            serde_json::to_vec_pretty(&list).unwrap(),
        )
        .unwrap();
        net
    }

    /// IPs host-local still holds.
    fn reserved(&self) -> Vec<String> {
        std::fs::read_dir(self.ipam.join("crishim-test"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Interfaces enslaved to the bridge (the pods' veths).
    fn veths(&self) -> usize {
        let out = std::process::Command::new("ip")
            .args(["-o", "link", "show", "master", &self.bridge])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
    }
}

async fn network_ready(env: &PodEnv) -> bool {
    let st = env.d.runtime_status().await.unwrap().status.unwrap();
    st.conditions
        .iter()
        .any(|c| c.r#type == "NetworkReady" && c.status)
}

fn http_get(addr: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

const HTTPD: &[&str] = &[
    "sh",
    "-c",
    "echo hello-from-pod > /tmp/index.html; exec busybox httpd -f -p 80 -h /tmp",
];

#[tokio::test]
async fn pods_get_addresses_reach_each_other_and_publish_host_ports() {
    let env = PodEnv::start().await;
    assert!(
        !network_ready(&env).await,
        "no CNI config yet: NetworkReady must be false"
    );
    let net = Net::install(&env, 11);
    assert!(
        network_ready(&env).await,
        "a config that appears turns the network ready without a restart"
    );

    let host_port = 20000 + (std::process::id() % 10000) as i32;
    let mut a_cfg = env.pod_config("web");
    a_cfg.port_mappings = vec![cri::PortMapping {
        protocol: 0,
        container_port: 80,
        host_port,
        host_ip: String::new(),
    }];
    a_cfg.dns_config = Some(cri::DnsConfig {
        servers: vec!["10.96.0.10".into()],
        searches: vec!["svc.cluster.local".into()],
        options: vec!["ndots:5".into()],
    });
    let a = env.d.run_pod(&a_cfg).await.expect("RunPodSandbox web");
    let web = env
        .d
        .run_container(&a, &env.container_config("web", HTTPD), &a_cfg)
        .await
        .unwrap();
    let b_cfg = env.pod_config("client");
    let b = env.d.run_pod(&b_cfg).await.expect("RunPodSandbox client");
    let client = env
        .d
        .run_container(
            &b,
            &env.container_config("client", &["sleep", "3600"]),
            &b_cfg,
        )
        .await
        .unwrap();
    let mut traces = vec![PodTraces::new(&a, &a_cfg), PodTraces::new(&b, &b_cfg)];
    traces[0].add_container(&web);
    traces[1].add_container(&client);
    for t in &mut traces {
        t.capture(&env.d).await;
    }

    let ip_a = env.d.pod_status(&a).await.unwrap().network.unwrap().ip;
    let ip_b = env.d.pod_status(&b).await.unwrap().network.unwrap().ip;
    let prefix = format!("10.98.{}.", net.third);
    assert!(
        ip_a.starts_with(&prefix) && ip_b.starts_with(&prefix),
        "pod IPs {ip_a} {ip_b} not in {}",
        net.subnet()
    );
    assert_ne!(ip_a, ip_b);
    // The container sees its address on eth0 and a loopback that is up.
    let addrs = env.d.exec_ok(&web, &["busybox", "ip", "addr"]).await;
    assert!(addrs.contains(&ip_a), "{addrs}");
    assert!(
        env.d
            .exec_ok(&web, &["cat", "/sys/class/net/lo/operstate"])
            .await
            .contains("unknown"),
        "lo must be up"
    );

    // Pod to pod.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let page = env
        .d
        .exec_ok(
            &client,
            &[
                "busybox",
                "wget",
                "-qO-",
                &format!("http://{ip_a}/index.html"),
            ],
        )
        .await;
    assert_eq!(page, "hello-from-pod\n");
    // hostPort on the node's loopback.
    let resp = tokio::task::spawn_blocking(move || http_get(&format!("127.0.0.1:{host_port}")))
        .await
        .unwrap();
    assert!(resp.contains("hello-from-pod"), "hostPort answer: {resp:?}");
    // DNS config and hostname inside the container.
    let resolv = env.d.exec_ok(&web, &["cat", "/etc/resolv.conf"]).await;
    assert!(
        resolv.contains("nameserver 10.96.0.10")
            && resolv.contains("search svc.cluster.local")
            && resolv.contains("ndots:5"),
        "{resolv}"
    );
    assert_eq!(env.d.exec_ok(&web, &["hostname"]).await.trim(), "web");

    for (pod, t) in [a, b].iter().zip(&traces) {
        env.d.stop_pod(pod).await.unwrap();
        env.d.remove_pod(pod).await.unwrap();
        assert_no_leaks(&env.d, t).await;
    }
    assert!(
        net.reserved().is_empty(),
        "IPs left allocated: {:?}",
        net.reserved()
    );
    assert_eq!(net.veths(), 0, "veths left on the bridge");
    env.stop();
}

#[tokio::test]
async fn twenty_pod_cycles_leave_no_veth_address_or_namespace() {
    let env = PodEnv::start().await;
    let net = Net::install(&env, 12);
    for i in 0..20 {
        let cfg = env.pod_config(&format!("cycle{i}"));
        let pod = env.d.run_pod(&cfg).await.expect("RunPodSandbox");
        assert_eq!(net.reserved().len(), 1);
        env.d.stop_pod(&pod).await.unwrap();
        env.d.remove_pod(&pod).await.unwrap();
    }
    assert!(
        net.reserved().is_empty(),
        "IPs left allocated: {:?}",
        net.reserved()
    );
    assert_eq!(net.veths(), 0, "veths left on the bridge");
    let pins = std::fs::read_dir(env.d.state_dir().join("netns"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(pins, 0, "pinned network namespaces left");
    env.stop();
}

#[tokio::test]
async fn host_network_pods_skip_cni_and_see_the_host() {
    let env = PodEnv::start().await;
    let net = Net::install(&env, 13);
    let mut cfg = env.pod_config("hostnet");
    set_pod_namespaces(&mut cfg, namespaces(NS_NODE, NS_POD, NS_POD));
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let ctr = env
        .d
        .run_container(
            &pod,
            &env.container_config("hostnet", &["sleep", "3600"]),
            &cfg,
        )
        .await
        .unwrap();
    let mut t = PodTraces::new(&pod, &cfg);
    t.add_container(&ctr);
    t.capture(&env.d).await;
    assert!(
        net.reserved().is_empty(),
        "no address for a host-network pod"
    );
    assert_eq!(
        env.d.pod_status(&pod).await.unwrap().network.unwrap().ip,
        ""
    );
    // The same network namespace as the host (interface counts would race with other tests).
    let host_ns = std::fs::read_link("/proc/self/ns/net").unwrap();
    let seen = env
        .d
        .exec_ok(&ctr, &["busybox", "readlink", "/proc/self/ns/net"])
        .await;
    assert_eq!(
        seen.trim(),
        host_ns.to_string_lossy(),
        "the container is in the host's network namespace"
    );
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &t).await;
    env.stop();
}

/// A pod with its own user namespace: the infra process makes the network namespace (inside
/// the user namespace, so the pod can mount sysfs), and the CNI ADD runs on it afterwards. The
/// pod gets its address, serves on port 80 as its (unprivileged on the host) root, and its
/// address and veth are gone after the pod is removed.
#[tokio::test]
async fn a_pod_with_its_own_user_namespace_gets_its_network_from_cni() {
    let env = PodEnv::start().await;
    let net = Net::install(&env, 14);
    let mut cfg = env.pod_config("userns-web");
    let base = 65536 * 300;
    crishim_tests::pods::set_pod_userns(&mut cfg, cri::NamespaceMode::Pod, base);
    let pod = env.d.run_pod(&cfg).await.expect("RunPodSandbox");
    let web = env
        .d
        .run_container(&pod, &env.container_config("web", HTTPD), &cfg)
        .await
        .unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    traces.add_container(&web);
    traces.capture(&env.d).await;
    let ip = env.d.pod_status(&pod).await.unwrap().network.unwrap().ip;
    assert!(ip.starts_with("10.98.14."), "{ip}");
    assert_eq!(net.veths(), 1);
    let mut body = String::new();
    for _ in 0..50 {
        body = http_get(&format!("{ip}:80"));
        if body.contains("hello-from-pod") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(body.contains("hello-from-pod"), "{body}");
    // The network namespace belongs to the pod's user namespace: its root may change it.
    assert_eq!(
        env.d
            .exec_ok(
                &web,
                &["sh", "-c", "cat /proc/self/uid_map; ls /sys/class/net"]
            )
            .await
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["0", &base.to_string(), "65536", "eth0", "lo"]
    );
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert!(net.reserved().is_empty(), "{:?}", net.reserved());
    assert_eq!(net.veths(), 0);
    crishim_tests::pods::assert_no_leaks(&env.d, &traces).await;
    env.stop();
}
