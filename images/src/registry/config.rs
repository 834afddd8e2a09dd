//! Registry settings: mirrors, TLS and credentials per host (the `[registry]` table of config.toml).

use std::collections::BTreeMap;

use base64::Engine as _;
use reqwest::Url;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// Per registry host, endpoints tried in order before the upstream.
    #[serde(default)]
    pub mirrors: BTreeMap<String, MirrorConfig>,
    /// Per endpoint host (`host[:port]`): credentials and TLS.
    #[serde(default)]
    pub configs: BTreeMap<String, HostConfig>,
    /// containerd's registry hosts directory (`<host>/hosts.toml`, see `registry::hosts`);
    /// for a host it names, it wins over `mirrors`.
    #[serde(default)]
    pub config_path: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorConfig {
    pub endpoint: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    pub auth: Option<AuthConfig>,
    pub tls: Option<TlsConfig>,
}

/// The same fields as containerd's `registry.configs.<host>.auth`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub username: Option<String>,
    pub password: Option<String>,
    /// base64 of `username:password`.
    pub auth: Option<String>,
    pub identitytoken: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

/// Credentials for one registry, from a CRI `AuthConfig` or from config.toml. Serialized only
/// into root-only files (a lazy layer's server spec).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Credentials {
    Basic {
        username: String,
        password: String,
    },
    /// An OAuth2 refresh token, exchanged at the token endpoint.
    IdentityToken(String),
    /// A bearer token sent as is.
    RegistryToken(String),
}

impl std::fmt::Debug for Credentials {
    // Never log secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Basic { username, .. } => write!(f, "Basic({username}, ***)"),
            Credentials::IdentityToken(_) => f.write_str("IdentityToken(***)"),
            Credentials::RegistryToken(_) => f.write_str("RegistryToken(***)"),
        }
    }
}

impl Credentials {
    /// Build credentials from the CRI/containerd field set. `None` when every field is empty.
    pub fn from_fields(
        username: &str,
        password: &str,
        auth: &str,
        identity_token: &str,
        registry_token: &str,
    ) -> Result<Option<Self>, String> {
        if !registry_token.is_empty() {
            return Ok(Some(Credentials::RegistryToken(registry_token.to_string())));
        }
        if !identity_token.is_empty() {
            return Ok(Some(Credentials::IdentityToken(identity_token.to_string())));
        }
        if !auth.is_empty() {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|e| format!("auth is not valid base64: {e}"))?;
            let text =
                String::from_utf8(raw).map_err(|_| "auth does not decode to UTF-8".to_string())?;
            let (u, p) = text
                .split_once(':')
                .ok_or("auth must encode \"username:password\"")?;
            return Ok(Some(Credentials::Basic {
                username: u.into(),
                password: p.into(),
            }));
        }
        if !username.is_empty() || !password.is_empty() {
            return Ok(Some(Credentials::Basic {
                username: username.into(),
                password: password.into(),
            }));
        }
        Ok(None)
    }
}

impl AuthConfig {
    pub fn credentials(&self) -> Result<Option<Credentials>, String> {
        let s = |o: &Option<String>| o.clone().unwrap_or_default();
        Credentials::from_fields(
            &s(&self.username),
            &s(&self.password),
            &s(&self.auth),
            &s(&self.identitytoken),
            "",
        )
    }
}

impl RegistryConfig {
    /// Check values serde cannot: endpoint URLs and credential encodings.
    pub fn validate(&self) -> Result<(), String> {
        for (host, mirror) in &self.mirrors {
            if mirror.endpoint.is_empty() {
                return Err(format!(
                    "registry.mirrors.{host:?}.endpoint: must list at least one URL"
                ));
            }
            for ep in &mirror.endpoint {
                parse_endpoint(ep)
                    .map_err(|e| format!("registry.mirrors.{host:?}.endpoint: {e}"))?;
            }
        }
        for (host, cfg) in &self.configs {
            if let Some(auth) = &cfg.auth {
                auth.credentials()
                    .map_err(|e| format!("registry.configs.{host:?}.auth: {e}"))?;
            }
        }
        if let Some(dir) = &self.config_path {
            if !dir.is_absolute() {
                return Err(format!(
                    "registry.config_path: {:?} must be an absolute path",
                    dir.display().to_string()
                ));
            }
            // Every file, and the certificates they name, are read now: a malformed one stops
            // the start rather than the first pull that needs it.
            let certs = super::hosts::CertsDir::load(dir)?;
            for h in certs.entries() {
                super::tls::with_host_certificates(reqwest::Client::builder(), h)?
                    .build()
                    .map_err(|e| format!("host {}: TLS settings: {e}", h.url))?;
            }
        }
        Ok(())
    }

    pub(crate) fn host(&self, host: &str) -> Option<&HostConfig> {
        self.configs.get(host)
    }
}

/// An endpoint URL must be `http(s)://host[:port]` with an optional path prefix.
pub(crate) fn parse_endpoint(s: &str) -> Result<Url, String> {
    let url = Url::parse(s).map_err(|e| format!("{s:?} is not a URL: {e}"))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(format!("{s:?}: scheme must be http or https"));
    }
    if url.host_str().is_none() {
        return Err(format!("{s:?}: has no host"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_from_cri_fields() {
        let b64 = base64::engine::general_purpose::STANDARD.encode("u:p:x");
        assert_eq!(
            Credentials::from_fields("", "", &b64, "", "").unwrap(),
            Some(Credentials::Basic {
                username: "u".into(),
                password: "p:x".into()
            })
        );
        assert_eq!(Credentials::from_fields("", "", "", "", "").unwrap(), None);
        assert!(Credentials::from_fields("", "", "!!", "", "").is_err());
        assert_eq!(
            Credentials::from_fields("u", "p", "", "", "tok").unwrap(),
            Some(Credentials::RegistryToken("tok".into()))
        );
    }

    #[test]
    fn validates_endpoints() {
        let mut c = RegistryConfig::default();
        c.mirrors.insert(
            "docker.io".into(),
            MirrorConfig {
                endpoint: vec!["ftp://x".into()],
            },
        );
        assert!(c.validate().unwrap_err().contains("scheme"));
        c.mirrors.insert(
            "docker.io".into(),
            MirrorConfig {
                endpoint: vec!["http://127.0.0.1:5000".into()],
            },
        );
        assert!(c.validate().is_ok());
    }
}
