//! `WWW-Authenticate` challenges and the Docker token flow (basic, bearer, OAuth2 refresh tokens).

use std::collections::HashMap;

use base64::Engine as _;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use reqwest::{StatusCode, Url};

use super::config::Credentials;
use super::Repository;
use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crishim_sys::shown::shown;

/// Token replies are capped by the bytes actually read (JWTs of a few KiB in practice).
pub const MAX_TOKEN_REPLY: u64 = 1 << 20;
/// Cached `Authorization` values; a flood of distinct credentials empties the cache.
const MAX_CACHED_AUTH: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parse one challenge: `Bearer realm="https://auth",service="registry",scope="repository:x:pull"`.
pub(crate) fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header
        .split_once(char::is_whitespace)
        .unwrap_or((header, ""));
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => Some(Challenge::Basic),
        "bearer" => {
            let mut params = parse_params(rest);
            Some(Challenge::Bearer {
                realm: params.remove("realm")?,
                service: params.remove("service"),
                scope: params.remove("scope"),
            })
        }
        _ => None,
    }
}

/// `key="quoted, value",key2=token` into a map; keys lowercased.
fn parse_params(s: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, remaining) = if let Some(q) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = q.char_indices();
            let mut end = q.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            value.push(n);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &q[end.min(q.len())..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        out.insert(key, value);
        rest = remaining.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

pub(crate) fn basic_header(username: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
    )
}

/// The token endpoint's answer; registries use either field name.
#[derive(serde::Deserialize)]
pub(crate) struct TokenResponse {
    token: Option<String>,
    access_token: Option<String>,
}

impl TokenResponse {
    pub(crate) fn into_token(self) -> Option<String> {
        self.token.or(self.access_token).filter(|t| !t.is_empty())
    }
}

/// What the token request must carry, decided from the credentials we hold.
pub(crate) enum TokenRequest<'a> {
    Anonymous,
    Basic(&'a str, &'a str),
    Refresh(&'a str),
}

impl<'a> TokenRequest<'a> {
    pub(crate) fn for_credentials(creds: Option<&'a Credentials>) -> Self {
        match creds {
            Some(Credentials::Basic { username, password }) => {
                TokenRequest::Basic(username, password)
            }
            Some(Credentials::IdentityToken(t)) => TokenRequest::Refresh(t),
            _ => TokenRequest::Anonymous,
        }
    }
}

impl Repository<'_> {
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

    /// The `Authorization` value that last worked for this endpoint, repository and credentials.
    pub(super) fn cached_authorization(&self) -> Option<String> {
        self.client
            .auth_cache
            .lock()
            .unwrap()
            .get(&self.cache_key())
            .cloned()
    }

    /// Remember a value the registry accepted, for the next request with the same key.
    pub(super) fn cache_authorization(&self, authorization: String) {
        let mut cache = self.client.auth_cache.lock().unwrap();
        if cache.len() >= MAX_CACHED_AUTH {
            cache.clear();
        }
        cache.insert(self.cache_key(), authorization);
    }

    /// Drop a cached value the registry has stopped accepting.
    pub(super) fn forget_authorization(&self) {
        self.client
            .auth_cache
            .lock()
            .unwrap()
            .remove(&self.cache_key());
    }

    pub(super) async fn authorize(&self, challenge: Challenge) -> Result<String> {
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
    use crate::registry::config::MirrorConfig;
    use crate::registry::tests::{repo, serve};
    use crate::registry::{RegistryClient, RegistryConfig};

    #[test]
    fn parses_bearer_challenges() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull""#,
        );
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/busybox:pull".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Negotiate x"), None);
        assert_eq!(
            parse_challenge(r#"Bearer service="x""#),
            None,
            "realm is required"
        );
    }

    #[test]
    fn parses_quoted_commas_and_escapes() {
        let p = parse_params(r#"realm="a,b", scope="repo:x:pull,push" , k=v, q="say \"hi\"""#);
        assert_eq!(p["realm"], "a,b");
        assert_eq!(p["scope"], "repo:x:pull,push");
        assert_eq!(p["k"], "v");
        assert_eq!(p["q"], "say \"hi\"");
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
