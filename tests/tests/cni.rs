//! `crishim_cni` with the real CNI plugins (`/opt/cni/bin`, `/usr/lib/cni`: bridge,
//! host-local, portmap, tuning) on real network namespaces made with `ip netns`. Needs root,
//! iproute2, iptables and busybox (`$BUSYBOX_BIN`, default `/bin/busybox`, for ping and nc).
//!
//! Every test has its own bridge (`cni<hex>`), /24 in 10.99.0.0/16, host-local data dir, conf
//! and cache dir, namespaces `crishim-cni-test-<hex>-<n>` and host ports, so tests may run in
//! parallel with each other and with other test binaries. [`Net`]'s drop removes the
//! namespaces, the bridge and any iptables rule naming the test's pods; the shared
//! `CNI-HOSTPORT-*` chains portmap creates are removed by the last test that uses them, and
//! only when they did not exist before and hold no other pod's rules.
//!
//! Debian's plugins (1.1.1) notes: the bridge with `isGateway` turns on
//! `net.ipv4.ip_forward` for the whole host (left on), and portmap sets `route_localnet` on the
//! bridge itself, so host ports answer on 127.0.0.1.

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crishim_cni::{netns, Cni, CniConfig, CniError, NetworkResult, PodNetwork, PortMapping};
use crishim_tests::random_hex;
use serde_json::{json, Value};

const NETWORK: &str = "crishim-test-net";

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("running {args:?}: {e}"));
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[track_caller]
fn run_ok(args: &[&str]) -> String {
    let (ok, out) = run(args);
    assert!(ok, "{args:?} failed: {out}");
    out
}

fn busybox() -> String {
    std::env::var("BUSYBOX_BIN").unwrap_or_else(|_| "/bin/busybox".into())
}

fn bin_dirs() -> Vec<PathBuf> {
    vec!["/opt/cni/bin".into(), "/usr/lib/cni".into()]
}

fn nat_rules() -> String {
    run_ok(&["iptables-save", "-t", "nat"])
}

fn all_rules() -> String {
    run_ok(&["iptables-save"])
}

fn link_exists(name: &str) -> bool {
    run(&["ip", "link", "show", "dev", name]).0
}

/// The host interfaces enslaved to `bridge`.
fn bridge_ports(bridge: &str) -> Vec<String> {
    let (ok, out) = run(&["ip", "-j", "link", "show", "master", bridge]);
    if !ok {
        return Vec::new();
    }
    link_names(&out)
}

/// The `ifname`s of `ip -j link show` output. JSON, not the text form: a veth that another
/// runtime is removing prints `Peer netns reference is invalid.` in text, which a text parse took
/// for an interface.
fn link_names(json: &str) -> Vec<String> {
    if json.trim().is_empty() {
        return Vec::new();
    }
    let links: Vec<serde_json::Value> = serde_json::from_str(json.trim())
        .unwrap_or_else(|e| panic!("ip -j link output is not JSON ({e}): {json}"));
    links
        .iter()
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect()
}

/// A unique third octet for 10.99.X.0/24 (not routed on this host yet) and unique host ports.
fn next_third_octet() -> u8 {
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let next =
        NEXT.get_or_init(|| AtomicU32::new(u32::from_str_radix(&random_hex(1), 16).unwrap()));
    for _ in 0..256 {
        let third = (next.fetch_add(1, Ordering::SeqCst) % 256) as u8;
        let (_, routes) = run(&["ip", "-4", "route", "show", &format!("10.99.{third}.0/24")]);
        if routes.trim().is_empty() {
            return third;
        }
    }
    panic!("no free /24 in 10.99.0.0/16")
}

fn next_host_port() -> u16 {
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let next = NEXT.get_or_init(|| {
        AtomicU32::new(20000 + u32::from_str_radix(&random_hex(2), 16).unwrap() % 20000)
    });
    next.fetch_add(1, Ordering::SeqCst) as u16
}

/// Users of portmap's shared chains in this process, and whether the chains were there
/// before the first one.
static PORTMAP_USERS: Mutex<(usize, bool)> = Mutex::new((0, false));

const SHARED_CHAINS: [&str; 3] = [
    "CNI-HOSTPORT-DNAT",
    "CNI-HOSTPORT-MASQ",
    "CNI-HOSTPORT-SETMARK",
];

fn shared_chains_exist() -> bool {
    nat_rules()
        .lines()
        .any(|l| l.starts_with(":CNI-HOSTPORT-DNAT "))
}

fn acquire_portmap() {
    let mut users = PORTMAP_USERS.lock().unwrap_or_else(|e| e.into_inner());
    if users.0 == 0 {
        users.1 = shared_chains_exist();
    }
    users.0 += 1;
}

fn release_portmap() {
    let mut users = PORTMAP_USERS.lock().unwrap_or_else(|e| e.into_inner());
    users.0 -= 1;
    if users.0 > 0 || users.1 {
        return;
    }
    let rules = nat_rules();
    if rules
        .lines()
        .any(|l| l.starts_with("-A CNI-HOSTPORT-DNAT "))
    {
        return; // someone else's pods
    }
    // The jumps from the built-in chains, then the chains.
    for line in rules.lines() {
        if line.starts_with("-A ")
            && SHARED_CHAINS
                .iter()
                .any(|c| line.ends_with(&format!("-j {c}")))
        {
            let chain = line.split_whitespace().nth(1).unwrap_or_default();
            if !chain.starts_with("CNI-") {
                delete_rule(line);
            }
        }
    }
    for chain in SHARED_CHAINS {
        run(&["iptables", "-t", "nat", "-F", chain]);
        run(&["iptables", "-t", "nat", "-X", chain]);
    }
}

/// Deletes an `iptables-save` rule line of the nat table (`-A ...`).
fn delete_rule(line: &str) {
    let script = format!("iptables -w -t nat -D {}", &line[3..]);
    let (ok, out) = run(&["sh", "-c", &script]);
    if !ok {
        eprintln!("{script}: {out}");
    }
}

/// One test's network: bridge, subnet, IPAM dir, conf and cache dirs, namespaces.
struct Net {
    tag: String,
    bridge: String,
    third: u8,
    tmp: tempfile::TempDir,
    namespaces: Mutex<Vec<String>>,
}

impl Net {
    fn new() -> Net {
        let tag = random_hex(4);
        let tmp = tempfile::tempdir().unwrap();
        for d in ["net.d", "cache", "ipam"] {
            std::fs::create_dir(tmp.path().join(d)).unwrap();
        }
        acquire_portmap();
        Net {
            bridge: format!("cni{tag}"),
            third: next_third_octet(),
            tag,
            tmp,
            namespaces: Mutex::new(Vec::new()),
        }
    }

    fn subnet(&self) -> String {
        format!("10.99.{}.0/24", self.third)
    }

    fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 99, self.third, 1)
    }

    fn conf_dir(&self) -> PathBuf {
        self.tmp.path().join("net.d")
    }

    fn cache_dir(&self) -> PathBuf {
        self.tmp.path().join("cache")
    }

    fn ipam_dir(&self) -> PathBuf {
        self.tmp.path().join("ipam")
    }

    /// The bridge plugin with host-local IPAM on this test's bridge and subnet (`range`:
    /// extra keys for the range, e.g. rangeStart/rangeEnd).
    fn bridge_plugin(&self, range: Value) -> Value {
        let mut r = json!({"subnet": self.subnet()});
        if let Value::Object(extra) = range {
            for (k, v) in extra {
                r[k] = v;
            }
        }
        json!({
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[r]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": self.ipam_dir(),
            }
        })
    }

    fn portmap_plugin() -> Value {
        json!({"type": "portmap", "capabilities": {"portMappings": true}})
    }

    /// bridge + host-local + portmap.
    fn standard_list(&self) -> Value {
        self.list(vec![self.bridge_plugin(json!({})), Self::portmap_plugin()])
    }

    fn list(&self, plugins: Vec<Value>) -> Value {
        json!({"cniVersion": "1.0.0", "name": NETWORK, "plugins": plugins})
    }

    fn write_config(&self, file: &str, list: &Value) {
        let tmp = self.conf_dir().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(list).unwrap()).unwrap();
        std::fs::rename(tmp, self.conf_dir().join(file)).unwrap();
    }

    fn cni(&self) -> Cni {
        let mut c = CniConfig::new(self.conf_dir(), bin_dirs(), self.cache_dir());
        c.timeout = Duration::from_secs(30);
        Cni::new(c)
    }

    /// A new network namespace; returns its name.
    fn netns(&self) -> String {
        let mut list = self.namespaces.lock().unwrap();
        let name = format!("crishim-cni-test-{}-{}", self.tag, list.len());
        run_ok(&["ip", "netns", "add", &name]);
        list.push(name.clone());
        name
    }

    fn pod(&self, id: &str, ns: &str) -> PodNetwork {
        PodNetwork {
            id: id.to_string(),
            netns: PathBuf::from(format!("/run/netns/{ns}")),
            ifname: "eth0".into(),
            name: format!("pod-{id}"),
            namespace: "cni-test".into(),
            uid: format!("uid-{id}"),
            ..Default::default()
        }
    }

    /// A pod id unique to this test.
    fn id(&self, n: &str) -> String {
        format!("{}{}", self.tag, n)
    }

    /// host-local's reservation file of `ip`.
    fn ip_file(&self, ip: IpAddr) -> PathBuf {
        self.ipam_dir().join(NETWORK).join(ip.to_string())
    }

    /// host-local's reservation files (IPs) in this network.
    fn reserved_ips(&self) -> BTreeSet<String> {
        std::fs::read_dir(self.ipam_dir().join(NETWORK))
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| n.parse::<IpAddr>().is_ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The pods with a cache entry, as a daemon opening the cache now would find them.
    fn cached(&self) -> Vec<String> {
        crishim_cni::cache::Cache::new(self.cache_dir())
            .ids()
            .unwrap()
    }

    /// Asserts nothing of pod `id` is left: no IP reservation of it, no cache entry, no
    /// iptables rule naming it, no interface in its netns but lo (when it still exists).
    #[track_caller]
    fn assert_pod_gone(&self, id: &str, ns: Option<&str>) {
        let owners: Vec<_> = self
            .reserved_ips()
            .into_iter()
            .filter(|ip| {
                std::fs::read_to_string(self.ipam_dir().join(NETWORK).join(ip))
                    .is_ok_and(|owner| owner.contains(id))
            })
            .collect();
        assert!(owners.is_empty(), "IPs still reserved for {id}: {owners:?}");
        assert!(
            !self.cached().iter().any(|c| c == id),
            "cache entry of {id} left"
        );
        let rules = all_rules();
        assert!(!rules.contains(id), "iptables rules name {id}:\n{rules}");
        if let Some(ns) = ns {
            let links = link_names(&run_ok(&["ip", "-j", "-n", ns, "link", "show"]));
            assert!(
                links.iter().all(|l| l == "lo"),
                "interfaces left in {ns}: {links:?}"
            );
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self
            .namespaces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            run(&["ip", "netns", "del", ns]);
        }
        // Rules of this test's pods that a failed test left (their comments name the pod id,
        // which starts with the tag): the jump in CNI-HOSTPORT-DNAT, then the pod's chain.
        let rules = nat_rules();
        let mut chains = BTreeSet::new();
        for line in rules
            .lines()
            .filter(|l| l.starts_with("-A ") && l.contains(&self.tag))
        {
            if let Some(target) = line.split(" -j ").nth(1) {
                chains.insert(target.trim().to_string());
            }
            delete_rule(line);
        }
        for chain in chains.iter().filter(|c| c.starts_with("CNI-DN-")) {
            run(&["iptables", "-w", "-t", "nat", "-F", chain]);
            run(&["iptables", "-w", "-t", "nat", "-X", chain]);
        }
        run(&["ip", "link", "del", &self.bridge]);
        release_portmap();
    }
}

fn pod_ipv4(r: &NetworkResult) -> Ipv4Addr {
    match r.pod_ip() {
        Some(IpAddr::V4(ip)) => ip,
        other => panic!("no IPv4 pod IP: {other:?} in {}", r.raw),
    }
}

/// The host-side veth of a bridge result (the interface without a sandbox that is not the
/// bridge).
fn host_veth(r: &NetworkResult, bridge: &str) -> String {
    r.interfaces
        .iter()
        .find(|i| i.sandbox.is_empty() && i.name != bridge)
        .unwrap_or_else(|| panic!("no host veth in {}", r.raw))
        .name
        .clone()
}

fn ping(from_ns: &str, to: Ipv4Addr) -> Result<(), String> {
    let to = to.to_string();
    let mut last = String::new();
    for _ in 0..3 {
        let (ok, out) = run(&[
            "ip",
            "netns",
            "exec",
            from_ns,
            &busybox(),
            "ping",
            "-c1",
            "-W2",
            &to,
        ]);
        if ok {
            return Ok(());
        }
        last = out;
    }
    Err(last)
}

/// Serves one TCP connection on port `port` inside netns `ns` (from a thread that entered
/// it), answering `reply`. The join handle yields whether a connection was served.
fn serve_in_netns(ns: &str, port: u16, reply: String) -> std::thread::JoinHandle<bool> {
    let ns_file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        nix::sched::setns(&ns_file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        // The previous server's connection on this port may still be closing (it was seen to
        // refuse a bind for a moment after the last serve): wait for it, briefly.
        let bind_deadline = Instant::now() + Duration::from_secs(5);
        let listener = loop {
            match TcpListener::bind(("0.0.0.0", port)) {
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse
                        && Instant::now() < bind_deadline =>
                {
                    std::thread::sleep(Duration::from_millis(50))
                }
                r => break r.expect("bind in netns"),
            }
        };
        listener.set_nonblocking(true).unwrap();
        tx.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    let _ = s.write_all(reply.as_bytes());
                    return true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
        false
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("listener in netns");
    handle
}

fn read_from(addr: (Ipv4Addr, u16)) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(3))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

#[tokio::test]
async fn setup_assigns_an_ip_pods_ping_each_other_and_teardown_releases_everything() {
    let net = Net::new();
    net.write_config("10-test.conflist", &net.standard_list());
    let cni = net.cni();
    assert_eq!(cni.ready(), Ok(()));

    let (ns_a, ns_b) = (net.netns(), net.netns());
    let (id_a, id_b) = (net.id("a"), net.id("b"));
    let pod_a = net.pod(&id_a, &ns_a);
    let pod_b = net.pod(&id_b, &ns_b);
    let ra = cni.setup(&pod_a).await.unwrap();
    let rb = cni.setup(&pod_b).await.unwrap();
    let (ip_a, ip_b) = (pod_ipv4(&ra), pod_ipv4(&rb));
    for ip in [ip_a, ip_b] {
        assert_eq!(
            &ip.octets()[..3],
            &[10, 99, net.third],
            "{ip} in {}",
            net.subnet()
        );
        assert_ne!(ip, net.gateway());
    }
    assert_ne!(ip_a, ip_b);
    assert!(ra.additional_ips().is_empty());
    assert_eq!(ra.ip_configs[0].prefix_len, 24);
    assert_eq!(ra.ip_configs[0].gateway, Some(IpAddr::V4(net.gateway())));
    assert_eq!(ra.cni_version, "1.0.0");

    // The address is on eth0 in the pod; the bridge and veths are on the host.
    let addrs = run_ok(&["ip", "netns", "exec", &ns_a, "ip", "addr", "show"]);
    assert!(addrs.contains(&format!("inet {ip_a}/24")), "{addrs}");
    assert!(addrs.contains("eth0"), "{addrs}");
    let (veth_a, veth_b) = (host_veth(&ra, &net.bridge), host_veth(&rb, &net.bridge));
    let ports: BTreeSet<_> = bridge_ports(&net.bridge).into_iter().collect();
    assert_eq!(
        ports,
        [veth_a.clone(), veth_b.clone()].into_iter().collect()
    );
    assert!(net.ip_file(IpAddr::V4(ip_a)).exists());
    assert_eq!(cni.cached_result(&id_a).unwrap().as_ref(), Some(&ra));

    ping(&ns_a, ip_b).unwrap_or_else(|e| panic!("{ns_a} -> {ip_b}: {e}"));
    ping(&ns_b, ip_a).unwrap_or_else(|e| panic!("{ns_b} -> {ip_a}: {e}"));
    ping(&ns_a, net.gateway()).unwrap_or_else(|e| panic!("{ns_a} -> gateway: {e}"));

    cni.teardown(&pod_a).await.unwrap();
    assert!(!net.ip_file(IpAddr::V4(ip_a)).exists(), "IP of a released");
    assert!(!link_exists(&veth_a), "veth of a removed");
    net.assert_pod_gone(&id_a, Some(&ns_a));
    // b is untouched.
    assert!(net.ip_file(IpAddr::V4(ip_b)).exists());
    assert_eq!(bridge_ports(&net.bridge), vec![veth_b.clone()]);
    assert!(ping(&ns_a, ip_b).is_err(), "a is off the network");

    cni.teardown(&pod_b).await.unwrap();
    net.assert_pod_gone(&id_b, Some(&ns_b));
    assert!(!link_exists(&veth_b));
    assert!(net.reserved_ips().is_empty());
    // DEL again is fine.
    cni.teardown(&pod_b).await.unwrap();
}

#[tokio::test]
async fn host_port_mapping_answers_on_localhost_and_bridge_address() {
    let net = Net::new();
    net.write_config("10-test.conflist", &net.standard_list());
    let cni = net.cni();
    let ns = net.netns();
    let id = net.id("web");
    let host_port = next_host_port();
    let mut pod = net.pod(&id, &ns);
    pod.port_mappings = vec![PortMapping {
        host_port: i32::from(host_port),
        container_port: 8080,
        protocol: "TCP".into(),
        host_ip: String::new(),
    }];
    let r = cni.setup(&pod).await.unwrap();
    let ip = pod_ipv4(&r);
    let nat = nat_rules();
    assert!(
        nat.contains(&format!("--to-destination {ip}:8080")),
        "no DNAT to the pod:\n{nat}"
    );
    assert!(nat.contains(&id), "the rules name the pod:\n{nat}");

    // Debian's portmap 1.1.1 sets route_localnet on the bridge, so 127.0.0.1 works.
    let server = serve_in_netns(&ns, 8080, format!("hello from {id}"));
    let got = read_from((Ipv4Addr::LOCALHOST, host_port))
        .unwrap_or_else(|e| panic!("127.0.0.1:{host_port}: {e}"));
    assert_eq!(got, format!("hello from {id}"));
    assert!(server.join().unwrap());
    let localnet = std::fs::read_to_string(format!(
        "/proc/sys/net/ipv4/conf/{}/route_localnet",
        net.bridge
    ))
    .unwrap();
    assert_eq!(localnet.trim(), "1");

    // And on the host's bridge address.
    let server = serve_in_netns(&ns, 8080, "again".into());
    let got = read_from((net.gateway(), host_port))
        .unwrap_or_else(|e| panic!("{}:{host_port}: {e}", net.gateway()));
    assert_eq!(got, "again");
    assert!(server.join().unwrap());

    cni.teardown(&pod).await.unwrap();
    net.assert_pod_gone(&id, Some(&ns));
    assert!(!nat_rules().contains(&format!("{ip}:8080")));
    assert!(
        read_from((Ipv4Addr::LOCALHOST, host_port)).is_err(),
        "mapping gone"
    );
}

#[tokio::test]
async fn twenty_setup_teardown_cycles_leave_nothing() {
    let net = Net::new();
    net.write_config("10-test.conflist", &net.standard_list());
    let cni = net.cni();
    let ns = net.netns();
    let mut ips = BTreeSet::new();
    for i in 0..20 {
        let id = net.id(&format!("c{i}"));
        let mut pod = net.pod(&id, &ns);
        pod.port_mappings = vec![PortMapping {
            host_port: i32::from(next_host_port()),
            container_port: 80,
            protocol: "udp".into(),
            host_ip: String::new(),
        }];
        let r = cni
            .setup(&pod)
            .await
            .unwrap_or_else(|e| panic!("cycle {i}: {e}"));
        let ip = pod_ipv4(&r);
        ips.insert(ip);
        assert!(net.ip_file(IpAddr::V4(ip)).exists());
        assert!(all_rules().contains(&id), "cycle {i}: portmap rule");
        cni.teardown(&pod)
            .await
            .unwrap_or_else(|e| panic!("cycle {i}: {e}"));
        net.assert_pod_gone(&id, Some(&ns));
        assert!(bridge_ports(&net.bridge).is_empty(), "cycle {i}: veth left");
    }
    // host-local hands out the next address each time rather than reusing at once.
    assert!(ips.len() > 1, "{ips:?}");
    assert!(net.reserved_ips().is_empty());
    assert!(
        !all_rules().contains(&net.tag),
        "iptables mention the test's pods"
    );
    assert_eq!(net.cached(), Vec::<String>::new(), "cache entries left");
}

#[tokio::test]
async fn missing_plugin_fails_before_anything_runs() {
    let net = Net::new();
    net.write_config(
        "10-test.conflist",
        &net.list(vec![
            net.bridge_plugin(json!({})),
            json!({"type": "nosuchplugin"}),
        ]),
    );
    let cni = net.cni();
    let reason = cni.ready().unwrap_err();
    assert!(reason.contains("nosuchplugin"), "{reason}");
    let ns = net.netns();
    let id = net.id("x");
    let err = cni.setup(&net.pod(&id, &ns)).await.unwrap_err();
    assert!(
        matches!(&err, CniError::PluginNotFound { plugin, .. } if plugin == "nosuchplugin"),
        "{err:?}"
    );
    assert!(err.to_string().contains("nosuchplugin"));
    assert!(!link_exists(&net.bridge), "bridge never ran");
    assert!(net.reserved_ips().is_empty());
    net.assert_pod_gone(&id, Some(&ns));
}

#[tokio::test]
async fn failing_plugin_after_bridge_is_undone() {
    let net = Net::new();
    // tuning fails on a sysctl that does not exist, after bridge and portmap succeeded.
    net.write_config(
        "10-test.conflist",
        &net.list(vec![
            net.bridge_plugin(json!({})),
            Net::portmap_plugin(),
            json!({"type": "tuning", "sysctl": {"net.ipv4.conf.eth0.crishim_no_such_knob": "1"}}),
        ]),
    );
    let cni = net.cni();
    let ns = net.netns();
    let id = net.id("bad");
    let mut pod = net.pod(&id, &ns);
    pod.port_mappings = vec![PortMapping {
        host_port: i32::from(next_host_port()),
        container_port: 80,
        protocol: "tcp".into(),
        host_ip: String::new(),
    }];
    let err = cni.setup(&pod).await.unwrap_err();
    match &err {
        CniError::Plugin {
            plugin,
            command,
            msg,
            ..
        } => {
            assert_eq!((plugin.as_str(), command.as_str()), ("tuning", "ADD"));
            assert!(msg.contains("crishim_no_such_knob"), "{msg}");
        }
        e => panic!("{e:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("tuning") && text.contains("crishim_no_such_knob"),
        "{text}"
    );
    net.assert_pod_gone(&id, Some(&ns));
    assert!(net.reserved_ips().is_empty(), "IP released by the undo");
    assert!(
        bridge_ports(&net.bridge).is_empty(),
        "veth removed by the undo"
    );
}

#[tokio::test]
async fn exhausted_ip_range_fails_naming_the_plugin_and_leaves_nothing() {
    let net = Net::new();
    let only = format!("10.99.{}.10", net.third);
    net.write_config(
        "10-test.conflist",
        &net.list(vec![
            net.bridge_plugin(json!({"rangeStart": only, "rangeEnd": only})),
            Net::portmap_plugin(),
        ]),
    );
    let cni = net.cni();
    let (ns1, ns2) = (net.netns(), net.netns());
    let (id1, id2) = (net.id("first"), net.id("second"));
    let r1 = cni.setup(&net.pod(&id1, &ns1)).await.unwrap();
    assert_eq!(pod_ipv4(&r1).to_string(), only);
    let err = cni.setup(&net.pod(&id2, &ns2)).await.unwrap_err();
    match &err {
        CniError::Plugin { plugin, msg, .. } => {
            assert_eq!(plugin, "bridge");
            assert!(msg.contains("no IP addresses available"), "{msg}");
        }
        e => panic!("{e:?}"),
    }
    // bridge 1.1.1 leaves its veth behind when IPAM fails; the undo removed it.
    net.assert_pod_gone(&id2, Some(&ns2));
    assert_eq!(bridge_ports(&net.bridge), vec![host_veth(&r1, &net.bridge)]);
    // The first pod keeps its address.
    assert_eq!(net.reserved_ips(), [only.clone()].into_iter().collect());
    cni.teardown(&net.pod(&id1, &ns1)).await.unwrap();
    net.assert_pod_gone(&id1, Some(&ns1));
    // Now the address is free for the second.
    let r2 = cni.setup(&net.pod(&id2, &ns2)).await.unwrap();
    assert_eq!(pod_ipv4(&r2).to_string(), only);
    cni.teardown(&net.pod(&id2, &ns2)).await.unwrap();
    net.assert_pod_gone(&id2, Some(&ns2));
}

#[tokio::test]
async fn ready_follows_the_conf_dir() {
    let net = Net::new();
    let cni = net.cni();
    let reason = cni.ready().unwrap_err();
    assert!(reason.contains("no network config"), "{reason}");
    let ns = net.netns();
    let id = net.id("early");
    assert!(matches!(
        cni.setup(&net.pod(&id, &ns)).await,
        Err(CniError::NoConfig(_))
    ));
    // A config appears (a .conf this time: one plugin, wrapped).
    let mut conf = net.bridge_plugin(json!({}));
    conf["cniVersion"] = json!("0.4.0");
    conf["name"] = json!(NETWORK);
    net.write_config("10-test.conf", &conf);
    assert_eq!(cni.ready(), Ok(()));
    let r = cni.setup(&net.pod(&id, &ns)).await.unwrap();
    assert_eq!(r.cni_version, "0.4.0");
    assert_eq!(&pod_ipv4(&r).octets()[..3], &[10, 99, net.third]);
    cni.teardown(&net.pod(&id, &ns)).await.unwrap();
    net.assert_pod_gone(&id, Some(&ns));
}

#[tokio::test]
async fn teardown_after_netns_and_config_are_gone_releases_the_ip() {
    let net = Net::new();
    net.write_config("10-test.conflist", &net.standard_list());
    let cni = net.cni();
    let ns = net.netns();
    let id = net.id("orphan");
    let mut pod = net.pod(&id, &ns);
    pod.port_mappings = vec![PortMapping {
        host_port: i32::from(next_host_port()),
        container_port: 80,
        protocol: "tcp".into(),
        host_ip: String::new(),
    }];
    let r = cni.setup(&pod).await.unwrap();
    let ip = pod_ipv4(&r);
    let veth = host_veth(&r, &net.bridge);
    run_ok(&["ip", "netns", "del", &ns]);
    // And the config is gone too: DEL runs with the cached one.
    std::fs::remove_file(net.conf_dir().join("10-test.conflist")).unwrap();
    assert!(cni.ready().is_err());
    cni.teardown(&pod).await.unwrap();
    assert!(!net.ip_file(IpAddr::V4(ip)).exists(), "IP released");
    net.assert_pod_gone(&id, None);
    // The veth dies with the namespace (asynchronously).
    let deadline = Instant::now() + Duration::from_secs(10);
    while link_exists(&veth) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!link_exists(&veth));
    // Again, with nothing cached and no config: no config is an error.
    assert!(matches!(
        cni.teardown(&pod).await,
        Err(CniError::NoConfig(_))
    ));
}

/// The pinned-netns helper: a namespace pinned from a process outlives it, works for CNI, and
/// unpinning removes it.
#[tokio::test]
async fn pinned_netns_outlives_its_process() {
    let net = Net::new();
    net.write_config("10-test.conflist", &net.standard_list());
    let cni = net.cni();
    let mut child = Command::new("unshare")
        .args(["--net", "sleep", "60"])
        .spawn()
        .unwrap();
    let pid = child.id();
    // Wait for unshare to have entered its namespace (it execs sleep afterwards).
    let host_ns = std::fs::metadata("/proc/self/ns/net").map(|m| {
        use std::os::unix::fs::MetadataExt as _;
        m.ino()
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ino = std::fs::metadata(netns::proc_netns(pid)).map(|m| {
            use std::os::unix::fs::MetadataExt as _;
            m.ino()
        });
        if ino.is_ok() && ino.as_ref().ok() != host_ns.as_ref().ok() {
            break;
        }
        assert!(Instant::now() < deadline, "unshare did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let path = net.tmp.path().join("pins").join("netns");
    struct Unpin<'a>(&'a Path);
    impl Drop for Unpin<'_> {
        fn drop(&mut self) {
            let _ = netns::unpin(self.0);
        }
    }
    let _guard = Unpin(&path);
    netns::pin(pid, &path).unwrap();
    netns::pin(pid, &path).unwrap(); // idempotent
    assert!(netns::is_netns(&path));
    let other = netns::pin(std::process::id(), &path).unwrap_err();
    assert_eq!(other.kind(), std::io::ErrorKind::AlreadyExists);
    child.kill().unwrap();
    child.wait().unwrap();

    let id = net.id("pinned");
    let pod = PodNetwork {
        netns: path.clone(),
        ..net.pod(&id, "unused")
    };
    let r = cni.setup(&pod).await.unwrap();
    let ip = pod_ipv4(&r);
    let ns_arg = format!("--net={}", path.display());
    let addrs = run_ok(&["nsenter", &ns_arg, "ip", "addr", "show", "eth0"]);
    assert!(addrs.contains(&format!("inet {ip}/24")), "{addrs}");
    cni.teardown(&pod).await.unwrap();
    net.assert_pod_gone(&id, None);
    let links = run_ok(&["nsenter", &ns_arg, "ip", "-o", "link", "show"]);
    assert!(links.lines().all(|l| l.contains(": lo:")), "{links}");

    netns::unpin(&path).unwrap();
    assert!(!path.exists());
    netns::unpin(&path).unwrap(); // idempotent
                                  // A plain file is removed, nothing is unmounted.
    std::fs::write(&path, "").unwrap();
    netns::unpin(&path).unwrap();
    assert!(!path.exists());
}

/// A pod's network namespace comes from the spare made after the previous pod took one: each
/// is a new namespace with its loopback up, never one already handed out; a spare a crashed
/// daemon left is unpinned at start, draining (no pod left) and closing unpin the one made
/// last, and none is made after closing.
#[test]
fn spare_network_namespaces_are_fresh_and_none_is_left_pinned() {
    use std::os::unix::fs::MetadataExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("netns");
    std::fs::create_dir(&dir).unwrap();
    let stale = dir.join(".spare-7");
    netns::pin(std::process::id(), &stale).unwrap();
    let spares = netns::Spares::new(dir.clone());
    assert!(!stale.exists(), "a stale spare stays pinned");
    let spare_names = || -> Vec<String> {
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".spare-"))
            .collect()
    };
    let host = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
    let mut seen = BTreeSet::new();
    for i in 0..4 {
        let path = dir.join(format!("pod{i}"));
        spares.take(&path).unwrap();
        assert!(netns::is_netns(&path));
        let ino = std::fs::metadata(&path).unwrap().ino();
        assert_ne!(ino, host, "pod{i} got the node's namespace");
        assert!(
            seen.insert(ino),
            "pod{i} got a namespace already handed out"
        );
        let ns_arg = format!("--net={}", path.display());
        let lo = run_ok(&["nsenter", &ns_arg, "ip", "-o", "link", "show", "lo"]);
        assert!(lo.contains("UP"), "loopback down in pod{i}: {lo}");
        // Let the background spare appear, so the next take hands one over.
        let deadline = Instant::now() + Duration::from_secs(5);
        while spare_names().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(spare_names().len(), 1, "after pod{i}: {:?}", spare_names());
    }
    // The last pod gone: the spare goes too, and the next pod brings spares back.
    spares.drain();
    assert!(spare_names().is_empty(), "left pinned: {:?}", spare_names());
    spares.take(&dir.join("pod4")).unwrap();
    assert!(netns::is_netns(&dir.join("pod4")));
    spares.close();
    assert!(spare_names().is_empty(), "left pinned: {:?}", spare_names());
    spares.take(&dir.join("pod5")).unwrap();
    assert!(spare_names().is_empty(), "a spare made after close");
    for i in 0..6 {
        netns::unpin(&dir.join(format!("pod{i}"))).unwrap();
    }
}
