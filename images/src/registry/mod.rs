//! A registry client for the OCI distribution API, pull side only.
//!
//! Written on `reqwest` rather than a full registry crate because crishim needs control over three
//! things: containerd-style mirror fallback per host, all four CRI credential forms (including OAuth2
//! refresh tokens), and blob bodies as raw streams so digests are verified while layers unpack.

pub(crate) mod auth;
pub mod config;
pub mod hosts;
mod tls;

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
use crishim_sys::shown::shown;

/// Media types we accept for manifests, most preferred first.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// Replies read whole into memory are capped by the bytes actually read, whatever their
/// `Content-Length` or chunking says. Manifests as containerd caps them; configs with room for
/// long histories; tokens (JWTs of a few KiB in practice); error bodies only as much as is shown.
pub const MAX_MANIFEST: u64 = 4 << 20;
pub const MAX_CONFIG: u64 = 8 << 20;
pub const MAX_TOKEN_REPLY: u64 = 1 << 20;
pub const MAX_ERROR_BODY: u64 = 4 << 10;
/// The longest a reply read whole may take, so a registry dripping bytes cannot hold a pull.
const SMALL_REPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// Redirects followed per request (blobs are commonly redirected to object storage).
const MAX_REDIRECTS: usize = 10;
/// Cached `Authorization` values; a flood of distinct credentials empties the cache.
const MAX_CACHED_AUTH: usize = 1024;

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

pub struct Manifest {
    pub bytes: Bytes,
    pub media_type: String,
    pub digest: Digest,
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

    /// Endpoint, repository and a hash of the credentials, so the cache never holds them in clear.
    fn cache_key(&self) -> String {
        let who = match &self.creds {
            None => "anonymous".to_string(),
            Some(Credentials::Basic { username, password }) => {
                Digest::of(format!("basic\0{username}\0{password}").as_bytes()).to_string()
            }
            Some(Credentials::IdentityToken(t)) => {
                Digest::of(format!("identity\0{t}").as_bytes()).to_string()
            }
            Some(Credentials::RegistryToken(t)) => {
                Digest::of(format!("registry\0{t}").as_bytes()).to_string()
            }
        };
        format!("{}|{}|{who}", self.endpoint.base, self.repository)
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
            for (name, value) in &self.endpoint.headers {
                req = req.header(name, value);
            }
            if let Some(a) = accept {
                req = req.header(ACCEPT, a);
            }
            if let Some(h) = &authorization {
                req = req.header(AUTHORIZATION, h);
            }
            let resp = req.send().await.map_err(|e| self.unavailable(e))?;
            if resp.status() != StatusCode::UNAUTHORIZED {
                if let Some(h) = authorization {
                    let mut cache = self.client.auth_cache.lock().unwrap();
                    if cache.len() >= MAX_CACHED_AUTH {
                        cache.clear();
                    }
                    cache.insert(self.cache_key(), h);
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
        let mut url = Url::parse(realm).map_err(|e| {
            self.unauthorized(&format!("bad token realm \"{}\": {e}", shown(realm)))
        })?;
        let realm = shown(realm);
        let service = service.unwrap_or_default();
        let request = TokenRequest::for_credentials(self.creds.as_ref());
        if !matches!(request, TokenRequest::Anonymous) && !self.client.plain_http.allows(&url) {
            return Err(self.unauthorized(&format!(
                "refusing to send credentials over plain HTTP to the token realm {realm}"
            )));
        }
        let resp = match request {
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
        let body = self
            .read_capped(resp, MAX_TOKEN_REPLY, &format!("token reply from {realm}"))
            .await?;
        let body: TokenResponse = serde_json::from_slice(&body).map_err(|e| {
            self.unauthorized(&format!(
                "token endpoint {realm} sent malformed JSON: {}",
                shown(&e.to_string())
            ))
        })?;
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

    /// Fetch a manifest or index by tag or digest; verify it when fetched by digest.
    pub async fn manifest(&self, reference: &str) -> Result<Manifest> {
        let what = format!("manifest {}:{}", self.repository, shown(reference));
        let resp = self
            .get(&self.url("manifests", reference), Some(MANIFEST_ACCEPT))
            .await?;
        let resp = self.check(what.clone(), resp).await?;
        let media_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|s| shown(s.split(';').next().unwrap_or(s).trim()).into_owned())
            .unwrap_or_default();
        let bytes = self.read_capped(resp, MAX_MANIFEST, &what).await?;
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
        let bytes = self.read_capped(resp, MAX_CONFIG, &what).await?;
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
            .endpoints("docker.io", false)
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
        let eps = c.endpoints("r.example.com", false);
        assert_eq!(eps.len(), 2, "insecure hosts fall back to http");
        assert!(eps[0].insecure_tls);
        let urls: Vec<String> = c
            .endpoints("127.0.0.1:5001", false)
            .iter()
            .map(|e| e.base.to_string())
            .collect();
        assert_eq!(urls, ["https://127.0.0.1:5001/", "http://127.0.0.1:5001/"]);
    }

    /// A one-request-per-connection HTTP server on loopback; `answer` gets each request's head.
    async fn serve(answer: impl Fn(&str, u16) -> Vec<u8> + Send + Sync + 'static) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let answer = std::sync::Arc::new(answer);
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let reply = answer(&String::from_utf8_lossy(&head), port);
                    let _ = sock.write_all(&reply).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        port
    }

    fn repo(client: &RegistryClient, port: u16, creds: Option<Credentials>) -> Repository<'_> {
        Repository {
            client,
            endpoint: Endpoint::at(
                Url::parse(&format!("http://127.0.0.1:{port}")).unwrap(),
                false,
                true,
            ),
            repository: "r".into(),
            creds,
        }
    }

    #[tokio::test]
    async fn a_hosts_toml_host_gets_its_headers_and_api_path() {
        let seen = std::sync::Arc::new(Mutex::new(String::new()));
        let log = seen.clone();
        let port = serve(move |head, _| {
            log.lock().unwrap().push_str(head);
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec()
        })
        .await;
        let certs = tempfile::tempdir().unwrap();
        std::fs::create_dir(certs.path().join("docker.io")).unwrap();
        std::fs::write(
            certs.path().join("docker.io/hosts.toml"),
            format!(
                "server = \"http://127.0.0.1:{port}/custom\"\noverride_path = true\n\
                 [header]\nx-crishim-test = [\"a\", \"b\"]\n"
            ),
        )
        .unwrap();
        let cfg = RegistryConfig {
            config_path: Some(certs.path().to_path_buf()),
            ..Default::default()
        };
        let client = RegistryClient::new(cfg).unwrap();
        let reference = Reference::parse("busybox").unwrap();
        assert!(client.resolve(&reference, None).await.is_err());
        let head = seen.lock().unwrap().to_lowercase();
        assert!(
            head.starts_with("get /custom/library/busybox/manifests/latest "),
            "{head}"
        );
        assert!(head.contains("x-crishim-test: a"), "{head}");
        assert!(head.contains("x-crishim-test: b"), "{head}");
    }

    fn chunked(total: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let chunk = vec![b'{'; 64 << 10];
        let mut sent = 0;
        while sent < total {
            out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            out.extend_from_slice(&chunk);
            out.extend_from_slice(b"\r\n");
            sent += chunk.len();
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    #[tokio::test]
    async fn replies_are_capped_by_the_bytes_read_not_by_their_headers() {
        let over = MAX_MANIFEST as usize + (1 << 20);
        for head in [
            // Chunked, no length at all.
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            // A Content-Length that lies small next to a chunked body (chunked wins).
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            let reply = [head.as_bytes(), &chunked(over)].concat();
            let port = serve(move |_, _| reply.clone()).await;
            let client = RegistryClient::new(RegistryConfig::default()).unwrap();
            let e = repo(&client, port, None)
                .manifest("v1")
                .await
                .err()
                .unwrap();
            assert!(
                e.to_string()
                    .contains(&format!("larger than {MAX_MANIFEST} bytes")),
                "{head:?}: {e}"
            );
        }
        // Delimited by the connection's end.
        let port = serve(move |_, _| {
            let mut r = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_vec();
            r.extend(vec![b'x'; over]);
            r
        })
        .await;
        let client = RegistryClient::new(RegistryConfig::default()).unwrap();
        let e = repo(&client, port, None)
            .manifest("v1")
            .await
            .err()
            .unwrap();
        assert!(e.to_string().contains("larger than"), "{e}");
    }

    #[tokio::test]
    async fn error_bodies_are_read_only_as_far_as_they_are_shown() {
        let port = serve(|_, _| {
            [
                &b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
                &chunked(64 << 20),
            ]
            .concat()
        })
        .await;
        let client = RegistryClient::new(RegistryConfig::default()).unwrap();
        let e = repo(&client, port, None)
            .manifest("v1")
            .await
            .err()
            .unwrap();
        assert_eq!(e.kind(), crate::ErrorKind::Unavailable, "{e}");
        assert!(e.to_string().len() < 1024, "{} bytes", e.to_string().len());
    }

    const TOKEN_USER: &str = "token-for-user";

    /// A registry whose manifest needs the token that only `user:pass` earns; anonymous token
    /// requests get a token the registry refuses.
    fn token_registry(head: &str, port: u16) -> Vec<u8> {
        let ok = |body: &str, ctype: &str| {
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        };
        let auth = head
            .lines()
            .find_map(|l| {
                l.strip_prefix("authorization: ")
                    .or(l.strip_prefix("Authorization: "))
            })
            .unwrap_or("");
        if head.starts_with("GET /token") {
            let token = if auth == basic_header("user", "pass") {
                TOKEN_USER
            } else {
                "token-for-nobody"
            };
            return ok(&format!("{{\"token\":\"{token}\"}}"), "application/json");
        }
        if auth == format!("Bearer {TOKEN_USER}") {
            return ok("{}", "application/vnd.oci.image.manifest.v1+json");
        }
        format!(
            "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"http://127.0.0.1:{port}/token\",service=\"test\"\r\nContent-Length: 0\r\n\r\n"
        )
        .into_bytes()
    }

    #[tokio::test]
    async fn a_token_earned_by_credentials_is_never_reused_without_them() {
        let port = serve(token_registry).await;
        let client = RegistryClient::new(RegistryConfig::default()).unwrap();
        let user = Credentials::Basic {
            username: "user".into(),
            password: "pass".into(),
        };
        repo(&client, port, Some(user.clone()))
            .manifest("v1")
            .await
            .expect("pull with credentials");
        let e = repo(&client, port, None).manifest("v1").await.err();
        assert_eq!(
            e.map(|e| e.kind()),
            Some(crate::ErrorKind::Unauthenticated),
            "an anonymous pull reused the token of a pull with credentials"
        );
        let other = Credentials::Basic {
            username: "user".into(),
            password: "wrong".into(),
        };
        let e = repo(&client, port, Some(other)).manifest("v1").await.err();
        assert!(e.is_some(), "other credentials reused the token");
        // The rightful owner still gets it from the cache.
        repo(&client, port, Some(user))
            .manifest("v1")
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn credentials_never_go_to_a_plain_http_realm_or_to_mirrors() {
        let port = serve(|_, _| {
            b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"http://realm.example.com/token\"\r\nContent-Length: 0\r\n\r\n".to_vec()
        })
        .await;
        let client = RegistryClient::new(RegistryConfig::default()).unwrap();
        let creds = Credentials::Basic {
            username: "u".into(),
            password: "p".into(),
        };
        let e = repo(&client, port, Some(creds.clone()))
            .manifest("v1")
            .await
            .err()
            .unwrap();
        assert!(e.to_string().contains("plain HTTP"), "{e}");

        let mut cfg = RegistryConfig::default();
        cfg.mirrors.insert(
            "r.example.com".into(),
            MirrorConfig {
                endpoint: vec![
                    "https://mirror.example.com".into(),
                    "http://plain.example.com".into(),
                ],
            },
        );
        let client = RegistryClient::new(cfg).unwrap();
        let eps = client.endpoints("r.example.com", false);
        let given: Vec<bool> = eps
            .iter()
            .map(|e| {
                client
                    .credentials_for(e, "r.example.com", Some(&creds))
                    .is_some()
            })
            .collect();
        assert_eq!(
            given,
            [false, false, true],
            "only the upstream gets the caller's credentials"
        );
    }
}
