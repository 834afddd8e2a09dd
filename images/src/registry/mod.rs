//! A registry client for the OCI distribution API, pull side only.
//!
//! Written on `reqwest` rather than a full registry crate because crishim needs control over three
//! things: containerd-style mirror fallback per host, all four CRI credential forms (including OAuth2
//! refresh tokens), and blob bodies as raw streams so digests are verified while layers unpack.

pub(crate) mod auth;
mod blob;
pub mod config;
pub mod hosts;
mod manifest;
mod push;
mod tls;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};
use reqwest::{StatusCode, Url};
use tracing::debug;

use self::auth::parse_challenge;
pub use self::auth::MAX_TOKEN_REPLY;
pub use self::blob::{Ranged, MAX_CONFIG, MAX_RANGE};
pub use self::config::{Credentials, RegistryConfig};
pub use self::manifest::{Manifest, MANIFEST_ACCEPT, MAX_MANIFEST};
use crate::error::{ImageError, Result};
use crate::reference::{Reference, DEFAULT_REGISTRY};
use crishim_sys::shown::shown;

/// Replies read whole into memory are capped by the bytes actually read, whatever their
/// `Content-Length` or chunking says (see [`MAX_MANIFEST`], [`MAX_CONFIG`], [`MAX_TOKEN_REPLY`]);
/// error bodies only as much as is shown.
pub const MAX_ERROR_BODY: u64 = 4 << 10;
/// The longest a reply read whole may take, so a registry dripping bytes cannot hold a pull.
const SMALL_REPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// Redirects followed per request (blobs are commonly redirected to object storage).
const MAX_REDIRECTS: usize = 10;

pub struct RegistryClient {
    config: RegistryConfig,
    /// `[registry] config_path`: containerd's `hosts.toml` files, which win over `mirrors`.
    certs: hosts::CertsDir,
    /// A client of its own for each `hosts.toml` host with a `ca` or `client` (by its URL).
    host_clients: HashMap<String, reqwest::Client>,
    verify: reqwest::Client,
    no_verify: reqwest::Client,
    /// `Authorization` values that worked, per endpoint, repository and the credentials that
    /// earned them: a pull with other credentials, or none, never reuses one.
    auth_cache: Mutex<HashMap<String, String>>,
    /// Hosts (`host[:port]`) that may see plain HTTP: loopback and `insecure_skip_verify` ones.
    plain_http: PlainHttp,
}

/// One place to fetch a registry's content from: a mirror or the upstream.
#[derive(Debug, Clone)]
struct Endpoint {
    base: Url,
    /// What `/<repository>/<kind>/<reference>` is appended to (`<base>/v2`, or a `hosts.toml`
    /// host's own path with `override_path`).
    api: String,
    insecure_tls: bool,
    /// The registry's own server (not a mirror): the caller's credentials may go to it.
    server: bool,
    /// A `hosts.toml` host's own TLS settings (`ca`, `client`).
    client: Option<reqwest::Client>,
    /// A `hosts.toml` host's `header` table, sent with every request to it.
    headers: Vec<(String, String)>,
}

impl Endpoint {
    /// A plain endpoint at `base` (its API under `/v2`).
    fn at(base: Url, insecure_tls: bool, server: bool) -> Self {
        Endpoint {
            api: format!("{}/v2", base.as_str().trim_end_matches('/')),
            base,
            insecure_tls,
            server,
            client: None,
            headers: Vec::new(),
        }
    }

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

/// Which hosts may be spoken to over plain HTTP, where credentials could be read on the wire.
#[derive(Clone)]
struct PlainHttp {
    insecure: Vec<String>,
}

impl PlainHttp {
    fn allows(&self, url: &Url) -> bool {
        url.scheme() == "https" || {
            let host = url_host(url);
            is_loopback(&host) || self.insecure.contains(&host)
        }
    }
}

/// `host[:port]` of a URL, as config keys spell hosts.
fn url_host(url: &Url) -> String {
    match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_string(),
    }
}

/// How long one read of a reply may wait, unless [`RegistryClient::with_read_timeout`] says.
const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(120);

impl RegistryClient {
    pub fn new(config: RegistryConfig) -> Result<Self> {
        Self::with_read_timeout(config, DEFAULT_READ_TIMEOUT)
    }

    /// A client whose every read of a reply (headers included) may wait `read_timeout`.
    pub fn with_read_timeout(config: RegistryConfig, read_timeout: Duration) -> Result<Self> {
        let certs = match &config.config_path {
            Some(dir) => hosts::CertsDir::load(dir)
                .map_err(|e| ImageError::io("reading registry hosts", std::io::Error::other(e)))?,
            None => hosts::CertsDir::default(),
        };
        // Hosts an operator named insecure, or named with an http:// URL, may see plain HTTP.
        let plain_http = PlainHttp {
            insecure: config
                .configs
                .iter()
                .filter(|(_, h)| h.tls.as_ref().is_some_and(|t| t.insecure_skip_verify))
                .map(|(host, _)| host.clone())
                .chain(
                    certs
                        .entries()
                        .filter(|h| h.skip_verify || h.url.scheme() == "http")
                        .map(|h| url_host(&h.url)),
                )
                .collect(),
        };
        // reqwest drops `Authorization` when a redirect changes host or port; this also refuses
        // a redirect from HTTPS down to plain HTTP on a host that may not see plain HTTP.
        let policy = || {
            let allowed = plain_http.clone();
            reqwest::redirect::Policy::custom(move |attempt| {
                let downgrade = attempt
                    .previous()
                    .last()
                    .is_some_and(|p| p.scheme() == "https")
                    && !allowed.allows(attempt.url());
                if attempt.previous().len() >= MAX_REDIRECTS {
                    attempt.error("too many redirects")
                } else if downgrade {
                    attempt.error("refusing a redirect from HTTPS to plain HTTP")
                } else {
                    attempt.follow()
                }
            })
        };
        let builder = |insecure: bool| {
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .read_timeout(read_timeout)
                .redirect(policy())
                .danger_accept_invalid_certs(insecure)
                .user_agent(concat!("crishim/", env!("CARGO_PKG_VERSION")))
        };
        let build = |b: reqwest::ClientBuilder| {
            b.build()
                .map_err(|e| ImageError::io("building HTTP client", std::io::Error::other(e)))
        };
        let mut host_clients = HashMap::new();
        for h in certs.entries() {
            if h.ca.is_empty() && h.client.is_empty() {
                continue;
            }
            let b = tls::with_host_certificates(builder(h.skip_verify), h)
                .map_err(|e| ImageError::io("reading registry hosts", std::io::Error::other(e)))?;
            host_clients.insert(h.url.to_string(), build(b)?);
        }
        Ok(RegistryClient {
            config,
            certs,
            host_clients,
            verify: build(builder(false))?,
            no_verify: build(builder(true))?,
            auth_cache: Mutex::default(),
            plain_http,
        })
    }

    /// Where to fetch `registry`'s content, in order. Its `hosts.toml` (or `_default`'s), when
    /// `config_path` has one, wins over `mirrors`, as in containerd: its hosts that may be asked
    /// (`resolve` for a tag, `pull` for a digest), then its server. Otherwise the mirrors, then
    /// the upstream. Loopback and insecure servers also get plain HTTP after HTTPS, as Docker
    /// does for insecure registries.
    fn endpoints(&self, registry: &str, by_digest: bool) -> Vec<Endpoint> {
        let mut out = Vec::new();
        if let Some(file) = self.certs.for_registry(registry) {
            for h in &file.hosts {
                let usable = if by_digest {
                    h.capabilities.pull
                } else {
                    h.capabilities.resolve
                };
                if !usable {
                    continue;
                }
                let insecure = h.skip_verify || self.insecure(&url_host(&h.url));
                let e = Endpoint {
                    base: h.url.clone(),
                    api: h.api.clone(),
                    insecure_tls: insecure,
                    server: h.is_server,
                    client: self.host_clients.get(h.url.as_str()).cloned(),
                    headers: h.headers.clone(),
                };
                let plain = (h.is_server && file.default_server)
                    .then(|| plain_http_fallback(&e, registry, insecure))
                    .flatten();
                out.push(e);
                out.extend(plain);
            }
            return out;
        }
        if let Some(m) = self.config.mirrors.get(registry) {
            for ep in &m.endpoint {
                if let Ok(base) = config::parse_endpoint(ep) {
                    let insecure = self.insecure(&url_host(&base));
                    out.push(Endpoint::at(base, insecure, false));
                }
            }
        }
        let upstream = upstream_host(registry);
        let insecure = self.insecure(registry);
        if let Ok(base) = Url::parse(&format!("https://{upstream}")) {
            let e = Endpoint::at(base, insecure, true);
            let plain = plain_http_fallback(&e, registry, insecure);
            out.push(e);
            out.extend(plain);
        }
        out
    }

    fn insecure(&self, host: &str) -> bool {
        self.config
            .host(host)
            .and_then(|h| h.tls.as_ref())
            .is_some_and(|t| t.insecure_skip_verify)
    }

    /// Credentials for an endpoint: the configured ones for its host win; the caller's (given for
    /// the image's registry) go only to that registry itself, never to a mirror. Neither goes over
    /// plain HTTP to a host that is not loopback or configured insecure.
    fn credentials_for(
        &self,
        endpoint: &Endpoint,
        registry: &str,
        request: Option<&Credentials>,
    ) -> Option<Credentials> {
        if !self.plain_http.allows(&endpoint.base) {
            return None;
        }
        let configured = self
            .config
            .host(&endpoint.host())
            .and_then(|h| h.auth.as_ref());
        match configured.map(|a| a.credentials()) {
            Some(Ok(Some(c))) => Some(c),
            _ if endpoint.server || endpoint.host() == upstream_host(registry) => request.cloned(),
            _ => None,
        }
    }

    /// Where to push `reference`: the registry's own endpoints (never a mirror), in the order a
    /// pull tries them; the first that answers is the one to use.
    pub fn push_targets(
        &self,
        reference: &Reference,
        creds: Option<&Credentials>,
    ) -> Vec<Repository<'_>> {
        self.endpoints(&reference.registry, false)
            .into_iter()
            .filter(|e| e.server || e.host() == upstream_host(&reference.registry))
            .map(|endpoint| Repository {
                client: self,
                creds: self.credentials_for(&endpoint, &reference.registry, creds),
                endpoint,
                repository: reference.repository.clone(),
            })
            .collect()
    }

    /// Find the first endpoint that serves the manifest for `reference`, and return it with the manifest.
    pub async fn resolve(
        &self,
        reference: &Reference,
        creds: Option<&Credentials>,
    ) -> Result<(Repository<'_>, Manifest)> {
        let mut best: Option<ImageError> = None;
        for endpoint in self.endpoints(&reference.registry, reference.digest.is_some()) {
            let repo = Repository {
                client: self,
                creds: self.credentials_for(&endpoint, &reference.registry, creds),
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

/// The same server over plain HTTP, tried after HTTPS for a loopback or insecure registry.
fn plain_http_fallback(https: &Endpoint, registry: &str, insecure: bool) -> Option<Endpoint> {
    if https.base.scheme() != "https" || !(insecure || is_loopback(registry)) {
        return None;
    }
    let mut plain = https.clone();
    plain.base.set_scheme("http").ok()?;
    plain.api = format!("http{}", https.api.strip_prefix("https")?);
    Some(plain)
}

/// The host that serves `registry` itself (Docker Hub's API is not on `docker.io`).
fn upstream_host(registry: &str) -> &str {
    if registry == DEFAULT_REGISTRY {
        "registry-1.docker.io"
    } else {
        registry
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
        format!(
            "{}/{}/{kind}/{reference}",
            self.endpoint.api, self.repository
        )
    }

    fn http(&self) -> &reqwest::Client {
        if let Some(c) = &self.endpoint.client {
            c
        } else if self.endpoint.insecure_tls {
            &self.client.no_verify
        } else {
            &self.client.verify
        }
    }

    fn registry(&self) -> String {
        self.endpoint.base.to_string()
    }

    /// GET with the auth dance: try with what we have, answer one 401 challenge, try once more.
    async fn get(&self, url: &str, accept: Option<&str>) -> Result<reqwest::Response> {
        let extra: Vec<(reqwest::header::HeaderName, String)> = accept
            .map(|a| (ACCEPT, a.to_string()))
            .into_iter()
            .collect();
        self.get_with(url, &extra).await
    }

    /// [`Self::get`] with `extra` headers.
    async fn get_with(
        &self,
        url: &str,
        extra: &[(reqwest::header::HeaderName, String)],
    ) -> Result<reqwest::Response> {
        self.send(reqwest::Method::GET, url, extra, None).await
    }

    /// A request with the auth dance; `body` is sent again after a challenge.
    async fn send(
        &self,
        method: reqwest::Method,
        url: &str,
        extra: &[(reqwest::header::HeaderName, String)],
        body: Option<Bytes>,
    ) -> Result<reqwest::Response> {
        let mut authorization = self.cached_authorization();
        if authorization.is_none() {
            if let Some(Credentials::RegistryToken(t)) = &self.creds {
                authorization = Some(format!("Bearer {t}"));
            }
        }
        for attempt in 0..2 {
            let mut req = self.http().request(method.clone(), url);
            if let Some(b) = &body {
                req = req.body(b.clone());
            }
            for (name, value) in &self.endpoint.headers {
                req = req.header(name, value);
            }
            for (name, value) in extra {
                req = req.header(name, value);
            }
            if let Some(h) = &authorization {
                req = req.header(AUTHORIZATION, h);
            }
            let resp = req.send().await.map_err(|e| self.unavailable(e))?;
            if resp.status() != StatusCode::UNAUTHORIZED {
                if let Some(h) = authorization {
                    self.cache_authorization(h);
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
        self.forget_authorization();
        Err(self.unauthorized(match &self.creds {
            Some(_) => "credentials were rejected (401 Unauthorized)",
            None => "authentication required and no credentials were given (401 Unauthorized)",
        }))
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
        // Only the head of an error body is read: it is shown cut anyway.
        let body = tokio::time::timeout(SMALL_REPLY_TIMEOUT, read_head(resp, MAX_ERROR_BODY))
            .await
            .unwrap_or_default();
        let detail = format!("{status}: {}", shown(String::from_utf8_lossy(&body).trim()));
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

    /// The whole body, refused once more than `cap` bytes have actually arrived.
    async fn read_capped(&self, resp: reqwest::Response, cap: u64, what: &str) -> Result<Bytes> {
        let too_big = || ImageError::BadContent(format!("{what} is larger than {cap} bytes"));
        // Content-Length is only a hint: a larger one is refused early, a smaller one is not trusted.
        if resp.content_length().is_some_and(|l| l > cap) {
            return Err(too_big());
        }
        match tokio::time::timeout(SMALL_REPLY_TIMEOUT, read_body(resp, cap)).await {
            Ok(Ok(body)) => Ok(body),
            Ok(Err(ReadError::TooBig)) => Err(too_big()),
            Ok(Err(ReadError::Http(e))) => Err(self.unavailable(e)),
            Err(_) => Err(ImageError::RegistryUnavailable {
                registry: self.registry(),
                detail: format!("{what} took longer than {SMALL_REPLY_TIMEOUT:?} to arrive"),
            }),
        }
    }
}

enum ReadError {
    TooBig,
    Http(reqwest::Error),
}

/// Read `resp` chunk by chunk, stopping with `TooBig` as soon as more than `cap` bytes arrived.
async fn read_body(mut resp: reqwest::Response, cap: u64) -> Result<Bytes, ReadError> {
    let mut buf = bytes::BytesMut::new();
    while let Some(chunk) = resp.chunk().await.map_err(ReadError::Http)? {
        if (buf.len() + chunk.len()) as u64 > cap {
            return Err(ReadError::TooBig);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// At most the first `cap` bytes of a body, for showing; errors end it early.
async fn read_head(mut resp: reqwest::Response, cap: u64) -> Vec<u8> {
    let mut buf = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        let room = cap as usize - buf.len();
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if buf.len() as u64 >= cap {
            break;
        }
    }
    buf
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

#[cfg(test)]
mod tests;
