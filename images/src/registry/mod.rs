//! A registry client for the OCI distribution API, pull side only.
//!
//! Written on `reqwest` rather than a full registry crate because crishim needs control over three
//! things: containerd-style mirror fallback per host, all four CRI credential forms (including OAuth2
//! refresh tokens), and blob bodies as raw streams so digests are verified while layers unpack.

pub(crate) mod auth;
pub mod config;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::{StatusCode, Url};
use tracing::debug;

use self::auth::{basic_header, parse_challenge, Challenge, TokenRequest, TokenResponse};
pub use self::config::{Credentials, RegistryConfig};
use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crate::reference::{Reference, DEFAULT_REGISTRY};

/// Media types we accept for manifests, most preferred first.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// Manifests and configs are small; refuse anything absurd before buffering it.
const MAX_SMALL_BLOB: u64 = 16 << 20;

pub struct RegistryClient {
    config: RegistryConfig,
    verify: reqwest::Client,
    no_verify: reqwest::Client,
    /// `Authorization` values that worked, per endpoint and repository.
    auth_cache: Mutex<HashMap<String, String>>,
}

/// One place to fetch a registry's content from: a mirror or the upstream.
#[derive(Debug, Clone)]
struct Endpoint {
    base: Url,
    insecure_tls: bool,
}

impl Endpoint {
    fn host(&self) -> String {
        match self.base.port() {
            Some(p) => format!("{}:{p}", self.base.host_str().unwrap_or_default()),
            None => self.base.host_str().unwrap_or_default().to_string(),
        }
    }
}

/// A repository on the endpoint that answered for the manifest; later fetches stay on it.
pub struct Repository<'a> {
    client: &'a RegistryClient,
    endpoint: Endpoint,
    repository: String,
    creds: Option<Credentials>,
}

pub struct Manifest {
    pub bytes: Bytes,
    pub media_type: String,
    pub digest: Digest,
}

impl RegistryClient {
    pub fn new(config: RegistryConfig) -> Result<Self> {
        let build = |insecure: bool| {
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .read_timeout(Duration::from_secs(120))
                .danger_accept_invalid_certs(insecure)
                .user_agent(concat!("crishim/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|e| ImageError::io("building HTTP client", std::io::Error::other(e)))
        };
        Ok(RegistryClient {
            config,
            verify: build(false)?,
            no_verify: build(true)?,
            auth_cache: Mutex::default(),
        })
    }

    /// Mirrors in order, then the upstream. Loopback and `insecure_skip_verify` hosts also get plain
    /// HTTP after HTTPS, as Docker does for insecure registries.
    fn endpoints(&self, registry: &str) -> Vec<Endpoint> {
        let mut out = Vec::new();
        if let Some(m) = self.config.mirrors.get(registry) {
            for ep in &m.endpoint {
                if let Ok(base) = config::parse_endpoint(ep) {
                    let mut e = Endpoint {
                        base,
                        insecure_tls: false,
                    };
                    e.insecure_tls = self.insecure(&e.host());
                    out.push(e);
                }
            }
        }
        let upstream = if registry == DEFAULT_REGISTRY {
            "registry-1.docker.io"
        } else {
            registry
        };
        let insecure = self.insecure(registry);
        if let Ok(base) = Url::parse(&format!("https://{upstream}")) {
            out.push(Endpoint {
                base,
                insecure_tls: insecure,
            });
        }
        if insecure || is_loopback(registry) {
            if let Ok(base) = Url::parse(&format!("http://{upstream}")) {
                out.push(Endpoint {
                    base,
                    insecure_tls: insecure,
                });
            }
        }
        out
    }

    fn insecure(&self, host: &str) -> bool {
        self.config
            .host(host)
            .and_then(|h| h.tls.as_ref())
            .is_some_and(|t| t.insecure_skip_verify)
    }

    /// Credentials for an endpoint: the configured ones for its host win, then the caller's.
    fn credentials_for(
        &self,
        endpoint: &Endpoint,
        request: Option<&Credentials>,
    ) -> Option<Credentials> {
        let configured = self
            .config
            .host(&endpoint.host())
            .and_then(|h| h.auth.as_ref());
        match configured.map(|a| a.credentials()) {
            Some(Ok(Some(c))) => Some(c),
            _ => request.cloned(),
        }
    }

    /// Find the first endpoint that serves the manifest for `reference`, and return it with the manifest.
    pub async fn resolve(
        &self,
        reference: &Reference,
        creds: Option<&Credentials>,
    ) -> Result<(Repository<'_>, Manifest)> {
        let mut best: Option<ImageError> = None;
        for endpoint in self.endpoints(&reference.registry) {
            let repo = Repository {
                client: self,
                creds: self.credentials_for(&endpoint, creds),
                endpoint,
                repository: reference.repository.clone(),
            };
            match repo.manifest(&reference.manifest_ref()).await {
                Ok(m) => return Ok((repo, m)),
                Err(e) => {
                    debug!(endpoint = %repo.endpoint.base, error = %e, "registry endpoint failed, trying the next");
                    // Keep the most telling failure: an auth or not-found answer beats a dead mirror.
                    if best.as_ref().is_none_or(|b| rank(&e) >= rank(b)) {
                        best = Some(e);
                    }
                }
            }
        }
        Err(best.unwrap_or_else(|| ImageError::RegistryUnavailable {
            registry: reference.registry.clone(),
            detail: "no endpoint configured".into(),
        }))
    }
}

fn rank(e: &ImageError) -> u8 {
    match e {
        ImageError::RegistryUnavailable { .. } => 0,
        ImageError::RegistryNotFound { .. } => 1,
        _ => 2,
    }
}

fn is_loopback(registry: &str) -> bool {
    let host = registry.rsplit_once(':').map_or(registry, |(h, p)| {
        if p.parse::<u16>().is_ok() {
            h
        } else {
            registry
        }
    });
    host == "localhost" || host.starts_with("127.") || host == "[::1]"
}

impl Repository<'_> {
    fn url(&self, kind: &str, reference: &str) -> String {
        let base = self.endpoint.base.as_str().trim_end_matches('/');
        format!("{base}/v2/{}/{kind}/{reference}", self.repository)
    }

    fn http(&self) -> &reqwest::Client {
        if self.endpoint.insecure_tls {
            &self.client.no_verify
        } else {
            &self.client.verify
        }
    }

    fn registry(&self) -> String {
        self.endpoint.base.to_string()
    }

    fn cache_key(&self) -> String {
        format!("{}|{}", self.endpoint.base, self.repository)
    }

    /// GET with the auth dance: try with what we have, answer one 401 challenge, try once more.
    async fn get(&self, url: &str, accept: Option<&str>) -> Result<reqwest::Response> {
        let mut authorization = self
            .client
            .auth_cache
            .lock()
            .unwrap()
            .get(&self.cache_key())
            .cloned();
        if authorization.is_none() {
            if let Some(Credentials::RegistryToken(t)) = &self.creds {
                authorization = Some(format!("Bearer {t}"));
            }
        }
        for attempt in 0..2 {
            let mut req = self.http().get(url);
            if let Some(a) = accept {
                req = req.header(ACCEPT, a);
            }
            if let Some(h) = &authorization {
                req = req.header(AUTHORIZATION, h);
            }
            let resp = req.send().await.map_err(|e| self.unavailable(e))?;
            if resp.status() != StatusCode::UNAUTHORIZED {
                if let Some(h) = authorization {
                    self.client
                        .auth_cache
                        .lock()
                        .unwrap()
                        .insert(self.cache_key(), h);
                }
                return Ok(resp);
            }
            if attempt == 1 {
                break;
            }
            let challenge = resp
                .headers()
                .get_all(WWW_AUTHENTICATE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find_map(parse_challenge)
                .ok_or_else(|| {
                    self.unauthorized("401 without a usable WWW-Authenticate challenge")
                })?;
            authorization = Some(self.authorize(challenge).await?);
        }
        self.client
            .auth_cache
            .lock()
            .unwrap()
            .remove(&self.cache_key());
        Err(self.unauthorized(match &self.creds {
            Some(_) => "credentials were rejected (401 Unauthorized)",
            None => "authentication required and no credentials were given (401 Unauthorized)",
        }))
    }

    async fn authorize(&self, challenge: Challenge) -> Result<String> {
        match challenge {
            Challenge::Basic => match &self.creds {
                Some(Credentials::Basic { username, password }) => {
                    Ok(basic_header(username, password))
                }
                Some(_) => {
                    Err(self.unauthorized("registry wants basic auth but only a token was given"))
                }
                None => {
                    Err(self.unauthorized("authentication required and no credentials were given"))
                }
            },
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => {
                let scope = scope.unwrap_or_else(|| format!("repository:{}:pull", self.repository));
                let token = self.fetch_token(&realm, service.as_deref(), &scope).await?;
                Ok(format!("Bearer {token}"))
            }
        }
    }

    async fn fetch_token(&self, realm: &str, service: Option<&str>, scope: &str) -> Result<String> {
        let mut url = Url::parse(realm)
            .map_err(|e| self.unauthorized(&format!("bad token realm {realm:?}: {e}")))?;
        let service = service.unwrap_or_default();
        let resp = match TokenRequest::for_credentials(self.creds.as_ref()) {
            TokenRequest::Refresh(refresh) => {
                let form = [
                    ("grant_type", "refresh_token"),
                    ("refresh_token", refresh),
                    ("service", service),
                    ("scope", scope),
                    ("client_id", "crishim"),
                ];
                let body: String = form
                    .iter()
                    .map(|(k, v)| format!("{k}={}", urlencode(v)))
                    .collect::<Vec<_>>()
                    .join("&");
                self.http()
                    .post(url)
                    .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(body)
                    .send()
                    .await
            }
            other => {
                url.query_pairs_mut()
                    .append_pair("service", service)
                    .append_pair("scope", scope);
                let mut req = self.http().get(url);
                if let TokenRequest::Basic(u, p) = other {
                    req = req.header(AUTHORIZATION, basic_header(u, p));
                }
                req.send().await
            }
        }
        .map_err(|e| self.unavailable(e))?;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(self.unauthorized(&format!("token endpoint {realm} answered {status}")));
        }
        if !status.is_success() {
            return Err(ImageError::RegistryUnavailable {
                registry: self.registry(),
                detail: format!("token endpoint {realm} answered {status}"),
            });
        }
        let body: TokenResponse = resp.json().await.map_err(|e| self.unavailable(e))?;
        body.into_token()
            .ok_or_else(|| self.unauthorized("token endpoint returned no token"))
    }

    fn unavailable(&self, e: reqwest::Error) -> ImageError {
        ImageError::RegistryUnavailable {
            registry: self.registry(),
            detail: error_chain(&e),
        }
    }

    fn unauthorized(&self, detail: &str) -> ImageError {
        ImageError::Unauthorized {
            registry: self.registry(),
            detail: detail.to_string(),
        }
    }

    /// Map a non-success answer to an error.
    async fn check(&self, what: String, resp: reqwest::Response) -> Result<reqwest::Response> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.text().await.unwrap_or_default();
        let detail = format!(
            "{status}: {}",
            body.chars().take(300).collect::<String>().trim()
        );
        Err(match status {
            StatusCode::NOT_FOUND => ImageError::RegistryNotFound {
                what,
                registry: self.registry(),
                detail,
            },
            StatusCode::FORBIDDEN => ImageError::Unauthorized {
                registry: self.registry(),
                detail,
            },
            _ => ImageError::RegistryUnavailable {
                registry: self.registry(),
                detail: format!("{what}: {detail}"),
            },
        })
    }

    /// Fetch a manifest or index by tag or digest; verify it when fetched by digest.
    pub async fn manifest(&self, reference: &str) -> Result<Manifest> {
        let what = format!("manifest {}:{reference}", self.repository);
        let resp = self
            .get(&self.url("manifests", reference), Some(MANIFEST_ACCEPT))
            .await?;
        let resp = self.check(what.clone(), resp).await?;
        let media_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.split(';').next().unwrap_or(s).trim().to_string())
            .unwrap_or_default();
        let bytes = self.read_small(resp, &what).await?;
        let digest = Digest::of(&bytes);
        if let Ok(expected) = Digest::parse(reference) {
            if expected != digest {
                return Err(ImageError::DigestMismatch {
                    what: "manifest",
                    expected: expected.to_string(),
                    actual: digest.to_string(),
                });
            }
        }
        debug!(%digest, %media_type, "fetched manifest");
        Ok(Manifest {
            bytes,
            media_type,
            digest,
        })
    }

    /// Fetch a small blob (an image config) whole, verified.
    pub async fn small_blob(&self, digest: &Digest) -> Result<Bytes> {
        let what = format!("blob {digest}");
        let resp = self.blob_response(digest).await?;
        let bytes = self.read_small(resp, &what).await?;
        let actual = Digest::of(&bytes);
        if &actual != digest {
            return Err(ImageError::DigestMismatch {
                what: "blob",
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(bytes)
    }

    /// Stream a blob. The caller verifies the digest as it consumes the stream.
    pub async fn blob_stream(
        &self,
        digest: &Digest,
    ) -> Result<impl Stream<Item = Result<Bytes>> + Send + 'static> {
        use futures::TryStreamExt as _;
        let resp = self.blob_response(digest).await?;
        let registry = self.registry();
        Ok(resp
            .bytes_stream()
            .map_err(move |e| ImageError::RegistryUnavailable {
                registry: registry.clone(),
                detail: format!("reading blob: {}", error_chain(&e)),
            }))
    }

    async fn blob_response(&self, digest: &Digest) -> Result<reqwest::Response> {
        let resp = self.get(&self.url("blobs", digest.as_str()), None).await?;
        self.check(format!("blob {digest}"), resp).await
    }

    async fn read_small(&self, resp: reqwest::Response, what: &str) -> Result<Bytes> {
        if resp.content_length().is_some_and(|l| l > MAX_SMALL_BLOB) {
            return Err(ImageError::BadContent(format!(
                "{what} is larger than {MAX_SMALL_BLOB} bytes"
            )));
        }
        let bytes = resp.bytes().await.map_err(|e| self.unavailable(e))?;
        if bytes.len() as u64 > MAX_SMALL_BLOB {
            return Err(ImageError::BadContent(format!(
                "{what} is larger than {MAX_SMALL_BLOB} bytes"
            )));
        }
        Ok(bytes)
    }
}

/// reqwest's Display hides the cause ("error sending request"); show the whole chain.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::config::{HostConfig, MirrorConfig, TlsConfig};

    #[test]
    fn endpoints_list_mirrors_then_upstream() {
        let mut cfg = RegistryConfig::default();
        cfg.mirrors.insert(
            "docker.io".into(),
            MirrorConfig {
                endpoint: vec![
                    "http://127.0.0.1:5000".into(),
                    "https://m.example.com".into(),
                ],
            },
        );
        cfg.configs.insert(
            "r.example.com".into(),
            HostConfig {
                tls: Some(TlsConfig {
                    insecure_skip_verify: true,
                }),
                ..Default::default()
            },
        );
        let c = RegistryClient::new(cfg).unwrap();
        let urls: Vec<String> = c
            .endpoints("docker.io")
            .iter()
            .map(|e| e.base.to_string())
            .collect();
        assert_eq!(
            urls,
            [
                "http://127.0.0.1:5000/",
                "https://m.example.com/",
                "https://registry-1.docker.io/"
            ]
        );
        let eps = c.endpoints("r.example.com");
        assert_eq!(eps.len(), 2, "insecure hosts fall back to http");
        assert!(eps[0].insecure_tls);
        let urls: Vec<String> = c
            .endpoints("127.0.0.1:5001")
            .iter()
            .map(|e| e.base.to_string())
            .collect();
        assert_eq!(urls, ["https://127.0.0.1:5001/", "http://127.0.0.1:5001/"]);
    }
}
