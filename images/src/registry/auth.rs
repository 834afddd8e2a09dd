//! `WWW-Authenticate` challenges and the Docker token flow (basic, bearer, OAuth2 refresh tokens).

use std::collections::HashMap;

use base64::Engine as _;

use super::config::Credentials;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
