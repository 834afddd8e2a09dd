//! `[nri]`: NRI plugins, with containerd's keys and defaults.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Timeouts longer than this would let one plugin stall every pod.
const MAX_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NriConfig {
    /// Off unless set: plugins run as root and see every pod.
    #[serde(default)]
    pub enable: bool,
    #[serde(default = "default_socket_path")]
    pub socket_path: PathBuf,
    #[serde(default = "default_plugin_path")]
    pub plugin_path: PathBuf,
    #[serde(default = "default_plugin_config_path")]
    pub plugin_config_path: PathBuf,
    /// A Go duration, as containerd writes it: `5s`, `500ms`, `1m30s`.
    #[serde(default = "default_registration_timeout")]
    pub plugin_registration_timeout: String,
    #[serde(default = "default_request_timeout")]
    pub plugin_request_timeout: String,
    #[serde(default)]
    pub disable_connections: bool,
}

impl Default for NriConfig {
    fn default() -> Self {
        NriConfig {
            enable: false,
            socket_path: default_socket_path(),
            plugin_path: default_plugin_path(),
            plugin_config_path: default_plugin_config_path(),
            plugin_registration_timeout: default_registration_timeout(),
            plugin_request_timeout: default_request_timeout(),
            disable_connections: false,
        }
    }
}

fn default_socket_path() -> PathBuf {
    "/var/run/nri/nri.sock".into()
}

fn default_plugin_path() -> PathBuf {
    "/opt/nri/plugins".into()
}

fn default_plugin_config_path() -> PathBuf {
    "/etc/nri/conf.d".into()
}

fn default_registration_timeout() -> String {
    "5s".into()
}

fn default_request_timeout() -> String {
    "2s".into()
}

impl NriConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (key, p) in [
            ("socket_path", &self.socket_path),
            ("plugin_path", &self.plugin_path),
            ("plugin_config_path", &self.plugin_config_path),
        ] {
            if !p.is_absolute() {
                return Err(format!(
                    "nri.{key} must be an absolute path, got {:?}",
                    p.display().to_string()
                ));
            }
        }
        self.registration_timeout()?;
        self.request_timeout()?;
        Ok(())
    }

    pub fn registration_timeout(&self) -> Result<Duration, String> {
        timeout(
            "plugin_registration_timeout",
            &self.plugin_registration_timeout,
        )
    }

    pub fn request_timeout(&self) -> Result<Duration, String> {
        timeout("plugin_request_timeout", &self.plugin_request_timeout)
    }
}

fn timeout(key: &str, text: &str) -> Result<Duration, String> {
    let d = parse_go_duration(text).ok_or_else(|| {
        format!("nri.{key}: {text:?} is not a duration such as \"2s\" or \"500ms\"")
    })?;
    if d.is_zero() || d > MAX_TIMEOUT {
        return Err(format!(
            "nri.{key}: {text:?} must be over 0 and at most {MAX_TIMEOUT:?}"
        ));
    }
    Ok(d)
}

/// A Go `time.Duration` string: numbers (decimals allowed) each with a unit among `ns`, `us`,
/// `µs`, `ms`, `s`, `m`, `h`, as in `1m30s`; `0` alone is zero.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() || text.len() > 64 {
        return None;
    }
    let mut rest = text;
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * nanos_per;
    }
    // Bounded before the conversion: a year is more than any timeout needs.
    (total.is_finite() && total < 365.0 * 86400e9).then(|| Duration::from_nanos(total as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_as_containerd_writes_them() {
        assert_eq!(parse_go_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_go_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        for bad in ["", "5", "s", "5x", "-1s", "1e9999h", "99999999999h"] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn timeouts_are_bounded() {
        let mut c = NriConfig::default();
        assert_eq!(c.registration_timeout().unwrap(), Duration::from_secs(5));
        assert_eq!(c.request_timeout().unwrap(), Duration::from_secs(2));
        c.plugin_request_timeout = "0s".into();
        assert!(c.validate().unwrap_err().contains("plugin_request_timeout"));
        c.plugin_request_timeout = "1h".into();
        assert!(c.validate().unwrap_err().contains("at most"));
        c.plugin_request_timeout = "2s".into();
        c.plugin_path = "rel".into();
        assert!(c.validate().unwrap_err().contains("nri.plugin_path"));
    }
}
