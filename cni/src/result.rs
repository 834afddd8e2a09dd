//! Parsing an ADD result: `ips` and `interfaces` (spec 0.3.x, 0.4.0 and 1.0.0 share the
//! shape; 0.3.x/0.4.0 add a `version` per IP), and the `ip4`/`ip6` of 0.1.0/0.2.0.

use std::net::IpAddr;

use serde_json::Value;

/// One entry of the result's `ips`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// The address (from the `address` CIDR).
    pub address: IpAddr,
    /// The prefix length of the `address` CIDR.
    pub prefix_len: u8,
    /// `gateway`, when given.
    pub gateway: Option<IpAddr>,
    /// `interface`: an index into [`NetworkResult::interfaces`].
    pub interface: Option<usize>,
}

/// One entry of the result's `interfaces`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Interface {
    pub name: String,
    pub mac: String,
    /// The netns path for interfaces inside the container; empty for host interfaces.
    pub sandbox: String,
}

/// The final result of ADD for a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkResult {
    /// The pod's addresses: those of `ip_configs` on the pod's interface (`CNI_IFNAME`) or
    /// naming no interface; all of them when that selects none. In result order.
    pub ips: Vec<IpAddr>,
    /// Every entry of the result's `ips`.
    pub ip_configs: Vec<IpConfig>,
    pub interfaces: Vec<Interface>,
    /// The result's `cniVersion`.
    pub cni_version: String,
    /// The result as the last plugin printed it (what is cached and passed as `prevResult`).
    pub raw: Value,
}

impl NetworkResult {
    /// Parses `raw`, selecting the IPs of interface `ifname` for [`NetworkResult::ips`].
    pub fn parse(raw: Value, ifname: &str) -> Result<Self, String> {
        let Value::Object(obj) = &raw else {
            return Err("the result is not a JSON object".into());
        };
        let cni_version = obj
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut interfaces = Vec::new();
        if let Some(list) = obj.get("interfaces") {
            let list = list.as_array().ok_or("\"interfaces\" is not an array")?;
            for i in list {
                let field = |k: &str| i.get(k).and_then(Value::as_str).unwrap_or_default();
                interfaces.push(Interface {
                    name: field("name").to_string(),
                    mac: field("mac").to_string(),
                    sandbox: field("sandbox").to_string(),
                });
            }
        }
        let mut ip_configs = Vec::new();
        if let Some(list) = obj.get("ips") {
            let list = list.as_array().ok_or("\"ips\" is not an array")?;
            for ip in list {
                let address = ip
                    .get("address")
                    .and_then(Value::as_str)
                    .ok_or("an entry of \"ips\" has no \"address\"")?;
                let interface = match ip.get("interface") {
                    None | Some(Value::Null) => None,
                    Some(v) => {
                        let i = v.as_u64().ok_or("\"interface\" is not an index")? as usize;
                        if i >= interfaces.len() {
                            return Err(format!("\"interface\" {i} is out of range"));
                        }
                        Some(i)
                    }
                };
                ip_configs.push(ip_config(address, ip.get("gateway"), interface)?);
            }
        } else {
            // 0.1.0 / 0.2.0
            for key in ["ip4", "ip6"] {
                if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
                    let address = v
                        .get("ip")
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("\"{key}\" has no \"ip\""))?;
                    ip_configs.push(ip_config(address, v.get("gateway"), None)?);
                }
            }
        }
        let on_pod = |c: &&IpConfig| match c.interface {
            None => true,
            Some(i) => interfaces[i].name == ifname,
        };
        let mut ips: Vec<IpAddr> = ip_configs
            .iter()
            .filter(on_pod)
            .map(|c| c.address)
            .collect();
        if ips.is_empty() {
            ips = ip_configs.iter().map(|c| c.address).collect();
        }
        Ok(NetworkResult {
            ips,
            ip_configs,
            interfaces,
            cni_version,
            raw,
        })
    }

    /// The pod IP: the first IPv4 address of [`NetworkResult::ips`], else the first.
    pub fn pod_ip(&self) -> Option<IpAddr> {
        self.ips
            .iter()
            .find(|ip| ip.is_ipv4())
            .or(self.ips.first())
            .copied()
    }

    /// The pod's addresses other than [`NetworkResult::pod_ip`], in order.
    pub fn additional_ips(&self) -> Vec<IpAddr> {
        let primary = self.pod_ip();
        let mut skipped = false;
        self.ips
            .iter()
            .filter(|ip| {
                if !skipped && Some(**ip) == primary {
                    skipped = true;
                    false
                } else {
                    true
                }
            })
            .copied()
            .collect()
    }
}

fn ip_config(
    cidr: &str,
    gateway: Option<&Value>,
    interface: Option<usize>,
) -> Result<IpConfig, String> {
    let (address, prefix_len) = parse_cidr(cidr)?;
    let gateway = match gateway {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Some(
            s.parse()
                .map_err(|_| format!("invalid gateway address {s:?}"))?,
        ),
        Some(_) => return Err("\"gateway\" is not a string".into()),
    };
    Ok(IpConfig {
        address,
        prefix_len,
        gateway,
        interface,
    })
}

/// Parses `address/prefix` (a bare address gets the full-length prefix).
pub fn parse_cidr(cidr: &str) -> Result<(IpAddr, u8), String> {
    let (addr, prefix) = match cidr.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (cidr, None),
    };
    let address: IpAddr = addr
        .parse()
        .map_err(|_| format!("invalid address {cidr:?}"))?;
    let max = if address.is_ipv4() { 32 } else { 128 };
    let prefix_len = match prefix {
        None => max,
        Some(p) => match p.parse::<u8>() {
            Ok(n) if n <= max => n,
            _ => return Err(format!("invalid prefix length in {cidr:?}")),
        },
    };
    Ok((address, prefix_len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// What bridge + host-local print (1.0.0): the bridge, the host veth, the pod's eth0.
    fn bridge_result_v1() -> Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "aa:bb:cc:dd:ee:01"},
                {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:02"},
                {"name": "eth0", "mac": "aa:bb:cc:dd:ee:03", "sandbox": "/run/netns/x"}
            ],
            "ips": [
                {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 2},
                {"address": "10.22.0.5/24", "gateway": "10.22.0.1", "interface": 2}
            ],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        })
    }

    #[test]
    fn parses_v1_result_and_prefers_ipv4() {
        let r = NetworkResult::parse(bridge_result_v1(), "eth0").unwrap();
        assert_eq!(r.cni_version, "1.0.0");
        assert_eq!(r.ips, vec![ip("fd00::5"), ip("10.22.0.5")]);
        assert_eq!(r.pod_ip(), Some(ip("10.22.0.5")));
        assert_eq!(r.additional_ips(), vec![ip("fd00::5")]);
        assert_eq!(r.interfaces.len(), 3);
        assert_eq!(r.interfaces[2].sandbox, "/run/netns/x");
        assert_eq!(
            r.ip_configs[1],
            IpConfig {
                address: ip("10.22.0.5"),
                prefix_len: 24,
                gateway: Some(ip("10.22.0.1")),
                interface: Some(2),
            }
        );
        assert_eq!(r.raw, bridge_result_v1());
    }

    #[test]
    fn parses_v040_result_with_versions() {
        let raw = json!({
            "cniVersion": "0.4.0",
            "interfaces": [{"name": "eth0", "sandbox": "/proc/1/ns/net"}, {"name": "net1"}],
            "ips": [
                {"version": "4", "address": "192.168.1.9/16", "gateway": "192.168.0.1",
                 "interface": 0},
                {"version": "4", "address": "172.16.0.2/24", "interface": 1},
                {"version": "6", "address": "2001:db8::9/64", "interface": 0}
            ]
        });
        let r = NetworkResult::parse(raw, "eth0").unwrap();
        assert_eq!(r.ips, vec![ip("192.168.1.9"), ip("2001:db8::9")]);
        assert_eq!(r.pod_ip(), Some(ip("192.168.1.9")));
        assert_eq!(r.additional_ips(), vec![ip("2001:db8::9")]);
        assert_eq!(r.ip_configs.len(), 3);
        // Another interface name selects none: all IPs.
        let r = NetworkResult::parse(r.raw, "eth9").unwrap();
        assert_eq!(r.ips.len(), 3);
    }

    #[test]
    fn ips_without_interface_belong_to_the_pod_and_ipv6_only_works() {
        let raw =
            json!({"cniVersion": "0.3.1", "ips": [{"version": "6", "address": "fd00::2/64"}]});
        let r = NetworkResult::parse(raw, "eth0").unwrap();
        assert_eq!(r.pod_ip(), Some(ip("fd00::2")));
        assert!(r.additional_ips().is_empty());
        let r = NetworkResult::parse(json!({"cniVersion": "1.0.0"}), "eth0").unwrap();
        assert_eq!(r.pod_ip(), None);
    }

    #[test]
    fn parses_v020_result() {
        let raw = json!({
            "cniVersion": "0.2.0",
            "ip4": {"ip": "10.1.2.3/16", "gateway": "10.1.0.1"},
            "ip6": {"ip": "fd00::3/64"}
        });
        let r = NetworkResult::parse(raw, "eth0").unwrap();
        assert_eq!(r.ips, vec![ip("10.1.2.3"), ip("fd00::3")]);
        assert_eq!(r.ip_configs[0].gateway, Some(ip("10.1.0.1")));
    }

    #[test]
    fn bad_results_are_errors() {
        for (raw, want) in [
            (json!("x"), "not a JSON object"),
            (json!({"ips": {}}), "not an array"),
            (json!({"ips": [{"gateway": "1.2.3.4"}]}), "no \"address\""),
            (
                json!({"ips": [{"address": "10.0.0.300/24"}]}),
                "invalid address",
            ),
            (
                json!({"ips": [{"address": "10.0.0.3/33"}]}),
                "invalid prefix",
            ),
            (
                json!({"ips": [{"address": "10.0.0.3/24", "interface": 0}]}),
                "out of range",
            ),
            (
                json!({"ips": [{"address": "10.0.0.3/24", "gateway": "x"}]}),
                "gateway",
            ),
        ] {
            let err = NetworkResult::parse(raw.clone(), "eth0").unwrap_err();
            assert!(err.contains(want), "{raw}: {err}");
        }
    }

    #[test]
    fn cidrs() {
        assert_eq!(parse_cidr("10.0.0.1/8").unwrap(), (ip("10.0.0.1"), 8));
        assert_eq!(parse_cidr("10.0.0.1").unwrap(), (ip("10.0.0.1"), 32));
        assert_eq!(parse_cidr("::1").unwrap(), (ip("::1"), 128));
        assert!(parse_cidr("::1/129").is_err());
        assert!(parse_cidr("").is_err());
    }
}
